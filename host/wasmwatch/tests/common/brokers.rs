//! A RabbitMQ (one per test binary, plain AMQP only) and nats-server on
//! loopback, and a raw NATS subscriber: the minimum of host/bus's
//! `tests/brokers/common.rs` the end-to-end tests need. The binaries come
//! from Debian's `rabbitmq-server` and `nats-server` (`tests/prepare`);
//! without them the tests fail and say so.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
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

/// The RabbitMQ of this test binary.
pub struct Rabbit {
    pub port: u16,
    /// Closing it (when this process ends) makes the watchdog stop the
    /// broker and its epmd and remove the folder.
    _watchdog: Mutex<ChildStdin>,
    _child: Mutex<Child>,
}

impl Rabbit {
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

/// Starts the broker on first use (blocks for its boot, ~5-10 s).
pub fn rabbit() -> &'static Rabbit {
    static RABBIT: OnceLock<Result<Rabbit, String>> = OnceLock::new();
    match RABBIT.get_or_init(start_rabbit) {
        Ok(r) => r,
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

fn start_rabbit() -> Result<Rabbit, String> {
    let started = Instant::now();
    let server = binary("rabbitmq-server", &["/usr/lib/rabbitmq/bin"]);
    let epmd = binary("epmd", &[]);
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("wasmwatch-e2e-rabbit-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let (port, dist_port, epmd_port) = (free_port(), free_port(), free_port());
    let config = format!(
        "listeners.tcp.default = 127.0.0.1:{port}\n\
         loopback_users = none\n\
         disk_free_limit.absolute = 1MB\n"
    );
    for (name, content) in [
        ("rabbitmq.conf", config.as_str()),
        ("enabled_plugins", "[].\n"),
        ("rabbitmq-env.conf", ""),
    ] {
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
            format!("wasmwatch-e2e-{pid}@localhost"),
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
    let deadline = started + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "RabbitMQ ({}) exited during start-up ({status}); its log ends:\n{}",
                server.display(),
                log_tail()
            ));
        }
        if amqp_answers(port) {
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
    eprintln!(
        "RabbitMQ up on 127.0.0.1:{port} after {:.1?}",
        started.elapsed()
    );
    Ok(Rabbit {
        port,
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

/// A nats-server on loopback, stopped when dropped.
pub struct Nats {
    pub port: u16,
    child: Child,
}

impl Nats {
    pub fn start() -> Nats {
        let port = free_port();
        let bin = binary("nats-server", &[]);
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let n = Nats { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut info = [0u8; 4];
                if s.read_exact(&mut info).is_ok() && &info == b"INFO" {
                    return n;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut sub = NatsSub {
            r: BufReader::new(s),
        };
        let info = sub.line().await;
        assert!(info.starts_with("INFO "), "{info}");
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}}\r\n\
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
                    let payload = self.exact(n).await;
                    return NatsMsg {
                        subject: parts[1].into(),
                        headers: None,
                        payload,
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
