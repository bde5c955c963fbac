//! A NATS publisher (core NATS, text protocol) over one TCP connection.
//!
//! ```text
//! connect: ◀ INFO {..}   ▶ CONNECT {"verbose":false,"headers":true,..} PING
//!          ◀ PONG (or -ERR, e.g. an authorization violation)
//! publish: ▶ PUB <subject> <n> / HPUB <subject> <h> <n> + payload, PING
//!          ◀ PONG: the server has processed the message (an -ERR for it,
//!            such as a permissions violation, would come first)
//! ```
//!
//! Server `PING`s are answered while publishing and, for an idle connection,
//! before it is reused (with anything else the server sent meanwhile, such
//! as `-ERR 'Stale Connection'` before it closed the connection). No TLS: a
//! server that requires it is refused with a clear error.
use tracing::debug;

use crate::io::Conn;
use crate::{Message, Problem, parse_url};

/// The longest protocol line accepted (an `INFO` of a big cluster is long).
const MAX_LINE: usize = 1 << 20;

/// Where and how to connect.
pub(crate) struct Target {
    host: String,
    host_in_url: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    token: Option<String>,
    connection_name: String,
}

impl Target {
    /// `nats://[user:password@|token@]host[:port]` (default port 4222).
    pub(crate) fn parse(url: &str, name: &str) -> Result<Target, String> {
        let p = parse_url(url)?;
        if p.scheme != "nats" {
            return Err(format!("{url:?} must start with nats://"));
        }
        if p.path.is_some() {
            return Err(format!("{url:?} must not have a path"));
        }
        if !p.query.is_empty() {
            return Err(format!("{url:?} must not have query parameters"));
        }
        let (user, password, token) = match (p.user, p.password) {
            (Some(u), Some(pw)) => (Some(u), Some(pw), None),
            (Some(token), None) => (None, None, Some(token)),
            _ => (None, None, None),
        };
        Ok(Target {
            host: p.host,
            host_in_url: p.host_in_url,
            port: p.port.unwrap_or(4222),
            user,
            password,
            token,
            connection_name: format!("wasmwatch/{name}"),
        })
    }

    /// The server's address for messages: no password, no token.
    pub(crate) fn address(&self) -> String {
        let user = self
            .user
            .as_ref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        format!("nats://{user}{}:{}", self.host_in_url, self.port)
    }
}

/// The subject: `destination`, or the routing key when `destination` is
/// empty (a plugin written with AMQP-style routing in mind still works).
fn subject<'a>(msg: &Message<'a>) -> Result<&'a str, Problem> {
    let s = if !msg.destination.is_empty() {
        msg.destination
    } else {
        msg.routing_key
    };
    if s.is_empty() {
        return Err(Problem::Invalid(
            "no NATS subject: destination and routing key are both empty".into(),
        ));
    }
    let bad = s.chars().any(|c| c.is_whitespace() || c.is_control())
        || s.split('.').any(|t| t.is_empty() || t == "*" || t == ">");
    if bad {
        return Err(Problem::Invalid(format!(
            "{s:?} is not a NATS subject to publish to (tokens separated by '.', \
             no empty tokens, no whitespace, no wildcards)"
        )));
    }
    Ok(s)
}

/// Refuses what NATS cannot carry, before anything is sent.
pub(crate) fn check(msg: &Message<'_>) -> Result<(), Problem> {
    subject(msg)?;
    for h in msg.headers {
        let bad_name = h.name.is_empty()
            || h.name
                .chars()
                .any(|c| c == ':' || c.is_whitespace() || c.is_control());
        if bad_name {
            return Err(Problem::Invalid(format!(
                "{:?} is not a NATS header name (no ':', whitespace or control characters)",
                h.name
            )));
        }
        if h.value.contains(['\r', '\n']) {
            return Err(Problem::Invalid(format!(
                "the value of NATS header {:?} contains a line break",
                h.name
            )));
        }
    }
    Ok(())
}

/// An `-ERR` from the server.
fn server_error(line: &str) -> Problem {
    let text = line
        .strip_prefix("-ERR")
        .unwrap_or(line)
        .trim()
        .trim_matches('\'')
        .to_string();
    let lower = text.to_ascii_lowercase();
    let permanent = [
        "authorization violation",
        "authentication",
        "permissions violation",
        "maximum payload",
        "invalid subject",
        "invalid publish subject",
    ]
    .iter()
    .any(|p| lower.contains(p));
    Problem::Refused {
        text,
        retryable: !permanent,
    }
}

/// One line off the front of `buf` (without CR LF), if complete.
fn take_line(buf: &mut Vec<u8>) -> Result<Option<String>, Problem> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(i) => {
            let line = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 2);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(Problem::Broken(
            "the server sent an over-long protocol line".into(),
        )),
        None => Ok(None),
    }
}

/// A connected publisher.
pub(crate) struct Session {
    io: Conn,
    max_payload: usize,
    headers: bool,
}

impl Session {
    pub(crate) async fn connect(t: &Target) -> Result<Session, Problem> {
        let io = Conn::connect(&t.host, t.port, None)
            .await
            .map_err(|e| Problem::Connect(e.to_string()))?;
        let mut s = Session {
            io,
            max_payload: 1 << 20,
            headers: false,
        };
        s.handshake(t).await.map_err(|p| match p {
            Problem::Broken(s) => Problem::Connect(format!("handshake failed: {s}")),
            p => p,
        })?;
        Ok(s)
    }

    async fn handshake(&mut self, t: &Target) -> Result<(), Problem> {
        let line = self.read_line().await?;
        let Some(info) = line.strip_prefix("INFO ") else {
            return Err(Problem::Broken(format!(
                "expected INFO from a NATS server, got {:?}",
                truncate(&line)
            )));
        };
        let info: serde_json::Value = serde_json::from_str(info)
            .map_err(|e| Problem::Broken(format!("unreadable INFO: {e}")))?;
        if info["tls_required"].as_bool() == Some(true) {
            return Err(Problem::Refused {
                text: "the server requires TLS, which wasmwatch's NATS client does not support"
                    .into(),
                retryable: false,
            });
        }
        if let Some(n) = info["max_payload"].as_u64() {
            self.max_payload = n as usize;
        }
        self.headers = info["headers"].as_bool() == Some(true);

        let mut connect = serde_json::json!({
            "verbose": false,
            "pedantic": false,
            "tls_required": false,
            "name": t.connection_name,
            "lang": "rust",
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1,
            "headers": true,
            "no_responders": false,
        });
        if let (Some(u), Some(p)) = (&t.user, &t.password) {
            connect["user"] = u.clone().into();
            connect["pass"] = p.clone().into();
        }
        if let Some(tok) = &t.token {
            connect["auth_token"] = tok.clone().into();
        }
        let out = format!("CONNECT {connect}\r\nPING\r\n");
        self.send(out.as_bytes()).await?;
        self.await_pong().await
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), Problem> {
        self.io
            .send(bytes)
            .await
            .map_err(|e| Problem::Broken(e.to_string()))
    }

    async fn read_line(&mut self) -> Result<String, Problem> {
        loop {
            if let Some(line) = take_line(&mut self.io.rbuf)? {
                return Ok(line);
            }
            self.io
                .fill()
                .await
                .map_err(|e| Problem::Broken(e.to_string()))?;
        }
    }

    /// Reads until `PONG`, answering `PING`s; `-ERR` fails.
    async fn await_pong(&mut self) -> Result<(), Problem> {
        loop {
            let line = self.read_line().await?;
            match line.split(' ').next().unwrap_or("") {
                "PONG" => return Ok(()),
                "PING" => self.send(b"PONG\r\n").await?,
                "-ERR" => return Err(server_error(&line)),
                _ => {} // +OK, INFO updates
            }
        }
    }

    pub(crate) async fn usable(&mut self) -> bool {
        let r: Result<(), Problem> = async {
            loop {
                while let Some(line) = take_line(&mut self.io.rbuf)? {
                    match line.split(' ').next().unwrap_or("") {
                        "PING" => self.send(b"PONG\r\n").await?,
                        "-ERR" => return Err(server_error(&line)),
                        _ => {}
                    }
                }
                let more = self
                    .io
                    .fill_now()
                    .await
                    .map_err(|e| Problem::Broken(e.to_string()))?;
                if !more {
                    return Ok(());
                }
            }
        }
        .await;
        match r {
            Ok(()) => true,
            Err(p) => {
                debug!(problem = %p, "NATS connection not reusable");
                false
            }
        }
    }

    pub(crate) async fn publish(&mut self, msg: &Message<'_>) -> Result<(), Problem> {
        let subject = subject(msg)?;
        let mut out = Vec::with_capacity(msg.payload.len() + 128);
        if msg.headers.is_empty() {
            if msg.payload.len() > self.max_payload {
                return Err(too_big(msg.payload.len(), self.max_payload));
            }
            out.extend_from_slice(format!("PUB {subject} {}\r\n", msg.payload.len()).as_bytes());
        } else {
            if !self.headers {
                return Err(Problem::Invalid(
                    "the NATS server does not support headers (HPUB)".into(),
                ));
            }
            let mut h = String::from("NATS/1.0\r\n");
            for x in msg.headers {
                h.push_str(&x.name);
                h.push_str(": ");
                h.push_str(&x.value);
                h.push_str("\r\n");
            }
            h.push_str("\r\n");
            let total = h.len() + msg.payload.len();
            if total > self.max_payload {
                return Err(too_big(total, self.max_payload));
            }
            out.extend_from_slice(format!("HPUB {subject} {} {total}\r\n", h.len()).as_bytes());
            out.extend_from_slice(h.as_bytes());
        }
        out.extend_from_slice(msg.payload);
        out.extend_from_slice(b"\r\nPING\r\n");
        self.send(&out).await?;
        self.await_pong().await
    }
}

fn too_big(size: usize, max: usize) -> Problem {
    Problem::Invalid(format!(
        "the message takes {size} bytes, more than the server's max_payload ({max})"
    ))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmwatch_core::action::Header;

    fn msg<'a>(destination: &'a str, routing_key: &'a str, headers: &'a [Header]) -> Message<'a> {
        Message {
            destination,
            routing_key,
            headers,
            payload: b"",
        }
    }

    #[test]
    fn subject_rule() {
        assert_eq!(subject(&msg("a.b", "k", &[])).unwrap(), "a.b");
        assert_eq!(subject(&msg("", "k.x", &[])).unwrap(), "k.x");
        for bad in ["", "a b", "a..b", ".a", "a.*", "a.>", "a\r\n"] {
            assert!(
                !subject(&msg(bad, "", &[])).unwrap_err().retryable(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn headers_are_checked() {
        let h = |n: &str, v: &str| {
            vec![Header {
                name: n.into(),
                value: v.into(),
            }]
        };
        assert!(check(&msg("s", "", &h("X-Id", "a b: c"))).is_ok());
        assert!(check(&msg("s", "", &h("X:Id", "v"))).is_err());
        assert!(check(&msg("s", "", &h("X Id", "v"))).is_err());
        assert!(check(&msg("s", "", &h("X", "v\r\nY: z"))).is_err());
    }

    #[test]
    fn server_errors_are_classified() {
        assert!(!server_error("-ERR 'Authorization Violation'").retryable());
        assert!(!server_error("-ERR 'Permissions Violation for Publish to \"x\"'").retryable());
        assert!(server_error("-ERR 'Stale Connection'").retryable());
        assert_eq!(
            server_error("-ERR 'Stale Connection'").to_string(),
            "refused by the server: Stale Connection"
        );
    }

    #[test]
    fn lines() {
        let mut b = b"PING\r\nPO".to_vec();
        assert_eq!(take_line(&mut b).unwrap().as_deref(), Some("PING"));
        assert_eq!(take_line(&mut b).unwrap(), None);
        assert_eq!(b, b"PO");
    }
}
