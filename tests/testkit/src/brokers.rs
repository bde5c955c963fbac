//! Message brokers on loopback for tests: a RabbitMQ (one per test
//! process, started on first use, optionally with an amqps listener, stopped
//! and its folder removed when the process ends), nats-servers, and a NATS
//! subscriber speaking the protocol by hand. The binaries come from Debian's
//! `rabbitmq-server` and `nats-server` packages, which `tests/prepare`
//! installs; without them the tests fail and say so.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A port nobody listens on (now).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Finds a broker binary, or fails the test saying how to install it.
pub fn binary(name: &str, extra_dirs: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = extra_dirs
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    for d in dirs {
        let candidate = d.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} is not installed (looked in {extra_dirs:?}, PATH and the sbin folders): \
         run tests/prepare (as root) to install the test brokers"
    );
}

// ---------------------------------------------------------------- RabbitMQ

/// PEM files for the broker's TLS listener: a CA, a server certificate for
/// `localhost` signed by it, and the certificate's key.
pub struct Tls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A client certificate and its key (PEM, PKCS#8).
pub struct ClientCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A fresh test CA, a server certificate for `localhost` signed by it, and
/// client certificates (extended key usage: client auth) for the given
/// common names, signed by the same CA.
pub fn certificates_with_clients(common_names: &[&str]) -> (Tls, Vec<ClientCert>) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "wasmwatch test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server = server.signed_by(&key, &ca).unwrap();
    let clients = common_names
        .iter()
        .map(|cn| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name.push(DnType::CommonName, *cn);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            ClientCert {
                cert_pem: params.signed_by(&key, &ca).unwrap().pem(),
                key_pem: key.serialize_pem(),
            }
        })
        .collect();
    let tls = Tls {
        ca_pem: ca.pem(),
        cert_pem: server.pem(),
        key_pem: key.serialize_pem(),
    };
    (tls, clients)
}

/// The RabbitMQ of this test process.
pub struct Rabbit {
    pub port: u16,
    /// The amqps port and the CA file, when started with [`rabbit_with_tls`].
    tls: Option<(u16, PathBuf)>,
    /// Started by [`rabbit_with_external_auth`]: EXTERNAL is the only login.
    external: bool,
    /// What `rabbitmqctl` needs to reach this node.
    ctl_env: Vec<(&'static str, String)>,
    /// The watchdog's stdin: when this process ends, the pipe closes and the
    /// watchdog stops the broker and its epmd and removes the folder.
    _watchdog: Mutex<ChildStdin>,
    /// The watchdog (never waited for: it outlives this process by the
    /// broker's shutdown time).
    _child: Mutex<Child>,
}

impl Rabbit {
    /// Runs `rabbitmqctl ARGS` against this broker; its output, or why it
    /// failed. `stop_app` / `start_app` restart the broker application
    /// (connections are closed, durable queues survive);
    /// `set_vm_memory_high_watermark absolute 1` raises a memory alarm.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let ctl = binary("rabbitmqctl", &["/usr/lib/rabbitmq/bin"]);
        let out = Command::new(&ctl)
            .args(args)
            .envs(self.ctl_env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", ctl.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("rabbitmqctl {args:?}: {}: {text}", out.status))
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/", self.port)
    }

    /// The amqps port (panics if the broker was started without TLS).
    pub fn tls_port(&self) -> u16 {
        self.tls
            .as_ref()
            .expect("RabbitMQ was started without TLS")
            .0
    }

    /// The CA that signed the server certificate (panics without TLS).
    pub fn ca_file(&self) -> &Path {
        &self
            .tls
            .as_ref()
            .expect("RabbitMQ was started without TLS")
            .1
    }

    /// Adds a user for client certificates whose common name is `name`
    /// (EXTERNAL login), with all permissions on vhost `/`. Its password
    /// (rabbitmqctl wants one) is random and never used.
    pub fn add_certificate_user(&self, name: &str) -> Result<(), String> {
        let unused = format!("unused-{}-{}", std::process::id(), free_port());
        self.ctl(&["add_user", name, &unused])?;
        self.ctl(&["set_permissions", "-p", "/", name, ".*", ".*", ".*"])?;
        Ok(())
    }

    pub fn tls_url(&self, ca_file: Option<&Path>) -> String {
        let query = ca_file
            .map(|p| format!("?cacertfile={}", p.display()))
            .unwrap_or_default();
        format!("amqps://guest:guest@localhost:{}/{query}", self.tls_port())
    }
}

static RABBIT: OnceLock<Result<Rabbit, String>> = OnceLock::new();

/// Starts the broker (plain AMQP only) on first use, one per test process;
/// blocks for its boot (~5-10 s). If [`rabbit_with_tls`] came first, this
/// is that broker.
pub fn rabbit() -> &'static Rabbit {
    match RABBIT.get_or_init(|| start_rabbit(None, false)) {
        Ok(r) => {
            assert!(
                !r.external,
                "this process's RabbitMQ takes only EXTERNAL logins (rabbit_with_external_auth)"
            );
            r
        }
        Err(e) => panic!("{e}"),
    }
}

/// Like [`rabbit`], with an amqps listener too, using the PEM files
/// `certificates` makes. Panics if this process's broker was already
/// started without TLS.
pub fn rabbit_with_tls(certificates: impl FnOnce() -> Tls) -> &'static Rabbit {
    match RABBIT.get_or_init(|| start_rabbit(Some(certificates()), false)) {
        Ok(r) => {
            assert!(
                r.tls.is_some() && !r.external,
                "this process's RabbitMQ was started without TLS (by rabbit()) or \
                 takes only EXTERNAL logins"
            );
            r
        }
        Err(e) => panic!("{e}"),
    }
}

/// A broker for client-certificate logins, one per test process: the
/// `rabbitmq_auth_mechanism_ssl` plugin, EXTERNAL as the only SASL mechanism
/// (PLAIN is refused, also on the plain listener), and an amqps listener
/// that verifies the peer and refuses clients without a certificate
/// (`certificates.ca_pem` is also the CA client certificates must chain to);
/// the user is the certificate's common name (add it with
/// [`Rabbit::add_certificate_user`]). Panics if this process's broker was
/// already started another way.
pub fn rabbit_with_external_auth(certificates: impl FnOnce() -> Tls) -> &'static Rabbit {
    match RABBIT.get_or_init(|| start_rabbit(Some(certificates()), true)) {
        Ok(r) => {
            assert!(
                r.external,
                "this process's RabbitMQ was started without EXTERNAL auth"
            );
            r
        }
        Err(e) => panic!("{e}"),
    }
}

const WATCHDOG: &str = r#"
dir=$1 epmd=$2 rabbit=$3
"$epmd" -port "$ERL_EPMD_PORT" -address 127.0.0.1 </dev/null >"$dir/epmd.log" 2>&1 &
e=$!
i=0
until "$epmd" -port "$ERL_EPMD_PORT" -names >/dev/null 2>&1 || [ $i -ge 100 ]; do
    i=$((i+1)); sleep 0.05
done
"$rabbit" </dev/null >"$dir/rabbit.log" 2>&1 &
r=$!
read -r _ || true
kill $r 2>/dev/null; wait $r 2>/dev/null
kill $e 2>/dev/null; wait $e 2>/dev/null
rm -rf "$dir"
"#;

fn start_rabbit(tls: Option<Tls>, external: bool) -> Result<Rabbit, String> {
    let started = Instant::now();
    let server = binary("rabbitmq-server", &["/usr/lib/rabbitmq/bin"]);
    let epmd = binary("epmd", &[]);
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("wasmwatch-test-rabbit-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let (port, dist_port, epmd_port) = (free_port(), free_port(), free_port());

    let mut config = format!(
        "listeners.tcp.default = 127.0.0.1:{port}\n\
         loopback_users = none\n\
         disk_free_limit.absolute = 1MB\n"
    );
    let plugins = if external {
        config.push_str(
            "auth_mechanisms.1 = EXTERNAL\n\
             ssl_cert_login_from = common_name\n",
        );
        "[rabbitmq_auth_mechanism_ssl].\n"
    } else {
        "[].\n"
    };
    let mut files = vec![
        ("enabled_plugins", plugins.to_string()),
        ("rabbitmq-env.conf", String::new()),
    ];
    if external && tls.is_none() {
        return Err("EXTERNAL auth needs the TLS listener".into());
    }
    let tls = tls.map(|t| {
        let tls_port = free_port();
        let d = dir.display();
        let (verify, require) = if external {
            ("verify_peer", true)
        } else {
            ("verify_none", false)
        };
        config.push_str(&format!(
            "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
             ssl_options.cacertfile = {d}/ca.pem\n\
             ssl_options.certfile = {d}/server.pem\n\
             ssl_options.keyfile = {d}/server.key\n\
             ssl_options.verify = {verify}\n\
             ssl_options.fail_if_no_peer_cert = {require}\n"
        ));
        files.push(("ca.pem", t.ca_pem));
        files.push(("server.pem", t.cert_pem));
        files.push(("server.key", t.key_pem));
        (tls_port, dir.join("ca.pem"))
    });
    files.push(("rabbitmq.conf", config));
    for (name, content) in files {
        std::fs::write(dir.join(name), content).map_err(|e| format!("writing {name}: {e}"))?;
    }

    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("sh")
        .arg(&dir)
        .arg(&epmd)
        .arg(&server)
        .env("HOME", &dir)
        .env("ERL_EPMD_PORT", epmd_port.to_string())
        .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
        .env(
            "RABBITMQ_NODENAME",
            format!("wasmwatch-test-{pid}@localhost"),
        )
        .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_NODE_PORT", port.to_string())
        .env("RABBITMQ_DIST_PORT", dist_port.to_string())
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", dir.join("log"))
        .env("RABBITMQ_LOGS", "-")
        .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
        .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
        .env("RABBITMQ_PID_FILE", dir.join("rabbitmq.pid"))
        .env(
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
            "-kernel inet_dist_use_interface {127,0,0,1}",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting sh for {}: {e}", server.display()))?;
    let watchdog = child.stdin.take().unwrap();

    let log_tail = || {
        let log = std::fs::read_to_string(dir.join("rabbit.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    let tls_up = || match &tls {
        Some((tls_port, _)) => TcpStream::connect(("127.0.0.1", *tls_port)).is_ok(),
        None => true,
    };
    let deadline = started + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "RabbitMQ ({}) exited during start-up ({status}); its log ends:\n{}",
                server.display(),
                log_tail()
            ));
        }
        if amqp_answers(port) && tls_up() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "RabbitMQ did not start within 90 s; its log ends:\n{}",
                log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let amqps = tls
        .as_ref()
        .map(|(p, _)| format!(" (amqps {p})"))
        .unwrap_or_default();
    eprintln!(
        "RabbitMQ up on 127.0.0.1:{port}{amqps} after {:.1?}",
        started.elapsed()
    );
    Ok(Rabbit {
        port,
        tls,
        external,
        ctl_env: vec![
            ("HOME", dir.display().to_string()),
            ("ERL_EPMD_PORT", epmd_port.to_string()),
            (
                "RABBITMQ_NODENAME",
                format!("wasmwatch-test-{pid}@localhost"),
            ),
            (
                "RABBITMQ_CONF_ENV_FILE",
                dir.join("rabbitmq-env.conf").display().to_string(),
            ),
        ],
        _watchdog: Mutex::new(watchdog),
        _child: Mutex::new(child),
    })
}

/// Whether an AMQP 0-9-1 server answers the protocol header on `port`.
fn amqp_answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut first = [0u8; 1];
    s.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
        && s.read_exact(&mut first).is_ok()
        && first[0] == 1
}

// ---------------------------------------------------------------- NATS

/// A nats-server on loopback, stopped when dropped.
pub struct Nats {
    pub port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl Nats {
    pub fn start(args: &[&str]) -> Nats {
        let mut n = Nats {
            port: free_port(),
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        n.restart();
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and waits for it.
    pub fn restart(&mut self) {
        self.stop();
        let bin = binary("nats-server", &[]);
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut info = [0u8; 4];
                if s.read_exact(&mut info).is_ok() && &info == b"INFO" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One message a subscriber received.
#[derive(Debug, PartialEq, Eq)]
pub struct NatsMsg {
    pub subject: String,
    /// The header block as sent (`NATS/1.0\r\n...\r\n\r\n`), for HMSG.
    pub headers: Option<String>,
    pub payload: Vec<u8>,
}

/// A subscriber speaking the protocol by hand.
pub struct NatsSub {
    r: BufReader<tokio::net::TcpStream>,
}

impl NatsSub {
    /// Subscribes to `subject` and returns once the server confirmed it.
    pub async fn subscribe(port: u16, subject: &str) -> NatsSub {
        Self::subscribe_with(port, subject, "").await
    }

    /// Subscribes as a user with a password.
    pub async fn subscribe_as(port: u16, subject: &str, user: &str, password: &str) -> NatsSub {
        let auth = format!(",\"user\":\"{user}\",\"pass\":\"{password}\"");
        Self::subscribe_with(port, subject, &auth).await
    }

    async fn subscribe_with(port: u16, subject: &str, auth: &str) -> NatsSub {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut sub = NatsSub {
            r: BufReader::new(s),
        };
        let info = sub.line().await;
        assert!(info.starts_with("INFO "), "{info}");
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1{auth}}}\r\n\
             SUB {subject} 1\r\nPING\r\n"
        );
        sub.r.get_mut().write_all(hello.as_bytes()).await.unwrap();
        loop {
            let l = sub.line().await;
            assert!(!l.starts_with("-ERR"), "{l}");
            if l == "PONG" {
                return sub;
            }
        }
    }

    async fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.r.read_line(&mut l).await.unwrap();
        assert!(n > 0, "the NATS server closed the subscriber's connection");
        l.trim_end_matches("\r\n").to_string()
    }

    /// The next message (within 5 s).
    pub async fn next(&mut self) -> NatsMsg {
        tokio::time::timeout(Duration::from_secs(5), self.next_inner())
            .await
            .expect("no NATS message within 5 s")
    }

    /// The next message within `within`, or `None`.
    pub async fn next_within(&mut self, within: Duration) -> Option<NatsMsg> {
        tokio::time::timeout(within, self.next_inner()).await.ok()
    }

    async fn next_inner(&mut self) -> NatsMsg {
        loop {
            let l = self.line().await;
            let parts: Vec<&str> = l.split(' ').collect();
            match parts[0] {
                "PING" => self.r.get_mut().write_all(b"PONG\r\n").await.unwrap(),
                "MSG" => {
                    let n: usize = parts.last().unwrap().parse().unwrap();
                    let body = self.exact(n).await;
                    return NatsMsg {
                        subject: parts[1].into(),
                        headers: None,
                        payload: body,
                    };
                }
                "HMSG" => {
                    let total: usize = parts[parts.len() - 1].parse().unwrap();
                    let hlen: usize = parts[parts.len() - 2].parse().unwrap();
                    let mut body = self.exact(total).await;
                    let payload = body.split_off(hlen);
                    return NatsMsg {
                        subject: parts[1].into(),
                        headers: Some(String::from_utf8(body).unwrap()),
                        payload,
                    };
                }
                _ => {}
            }
        }
    }

    /// `n` bytes and the CR LF after them.
    async fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n + 2];
        self.r.read_exact(&mut b).await.unwrap();
        assert_eq!(&b[n..], b"\r\n");
        b.truncate(n);
        b
    }
}
