//! NATS on `async-nats`: one client per bus.
//!
//! ```text
//! connect: async-nats connect (user/password, token, NKey or creds file;
//!          TLS when the URL is tls:// or the spec names TLS files)
//! publish: PUB / HPUB, then PUB of a marker to this client's own inbox
//!          ─▶ the marker comes back: the server has processed the message
//!          (an -ERR for it, such as a permissions violation, comes first and
//!          is reported by the client's event callback)
//! ```
//!
//! The marker stands in for the PING/PONG a hand-written client would send:
//! async-nats's `flush` only means "written to the socket". A server
//! processes one connection's messages in order, so the marker's return
//! proves the message before it was processed. Users restricted by
//! permissions must be allowed to publish and subscribe to `_INBOX.>` (as
//! request/reply needs anyway).
//!
//! async-nats reconnects on its own in the background; a publish does not
//! wait for that: a client found disconnected is replaced by a fresh
//! connection (which fails at once while the server is down), so a publish
//! never hangs on a dead server longer than its timeout.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::client::PublishErrorKind;
use async_nats::{ConnectErrorKind, ConnectOptions, Event, HeaderMap, ServerError};
use bytes::Bytes;
use tokio::sync::watch;
use wasmwatch_core::manifest::NatsSpec;

use crate::{Message, Problem, parse_url, read_secret};

/// Where and how to connect.
pub(crate) struct Target {
    server: String,
    address: String,
    auth: Auth,
    tls: Option<wasmwatch_core::manifest::TlsFiles>,
    require_tls: bool,
    connection_name: String,
}

#[derive(Clone)]
enum Auth {
    None,
    UserPassword(String, String),
    Token(String),
    NKey(String),
    Creds(String),
}

impl Auth {
    /// What a refused login most likely means, for this way of logging in.
    fn refusal_hint(&self) -> &'static str {
        match self {
            Auth::None => "the server requires authentication and none was given",
            Auth::UserPassword(..) => "wrong user or password?",
            Auth::Token(_) => "wrong token?",
            Auth::NKey(_) => "the server does not know this NKey",
            Auth::Creds(_) => {
                "the server does not accept the credsFile's user: its account unknown to \
                 the server's resolver or signed by another operator, the JWT expired or \
                 revoked, or the seed not the user's?"
            }
        }
    }
}

impl Target {
    /// `nats://[user:password@|token@]host[:port]` (default port 4222), or
    /// `tls://...` to require TLS. Secrets may come from files instead
    /// (`passwordFile`, `tokenFile`, `nkeyFile`, `credsFile`); at most one
    /// way to authenticate.
    pub(crate) fn parse(spec: &NatsSpec, name: &str) -> Result<Target, String> {
        let url = &spec.url;
        let p = parse_url(url)?;
        let require_tls = match p.scheme.as_str() {
            "nats" => false,
            "tls" => true,
            _ => return Err(format!("{url:?} must start with nats:// or tls://")),
        };
        if p.path.is_some() {
            return Err(format!("{url:?} must not have a path"));
        }
        if !p.query.is_empty() {
            return Err(format!("{url:?} must not have query parameters"));
        }
        let mut ways: Vec<(&str, Auth)> = Vec::new();
        let file_password = spec.password_file.as_deref().map(read_secret).transpose()?;
        match (p.user.clone(), p.password.or(file_password)) {
            (Some(u), Some(pw)) => ways.push(("user and password", Auth::UserPassword(u, pw))),
            (Some(token), None) => ways.push(("token in the URL", Auth::Token(token))),
            (None, Some(_)) => return Err("passwordFile needs a user in the URL".into()),
            (None, None) => {}
        }
        if let Some(f) = &spec.token_file {
            ways.push(("tokenFile", Auth::Token(read_secret(f)?)));
        }
        if let Some(f) = &spec.nkey_file {
            let seed = read_secret(f)?;
            if !seed.starts_with("SU") {
                return Err(format!(
                    "{} does not hold an NKey user seed (it starts with SU)",
                    f.display()
                ));
            }
            ways.push(("nkeyFile", Auth::NKey(seed)));
        }
        if let Some(f) = &spec.creds_file {
            let text = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            // Checked now, so that a bad file is a start-up error.
            ConnectOptions::with_credentials(&text)
                .map_err(|e| format!("{} is not a NATS credentials file: {e}", f.display()))?;
            ways.push(("credsFile", Auth::Creds(text)));
        }
        if ways.len() > 1 {
            let names: Vec<&str> = ways.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "more than one way to authenticate: {} (choose one)",
                names.join(", ")
            ));
        }
        let auth = ways.pop().map(|(_, a)| a).unwrap_or(Auth::None);
        if let Some(t) = &spec.tls {
            for f in [&t.ca_file, &t.cert_file, &t.key_file]
                .into_iter()
                .flatten()
            {
                std::fs::metadata(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            }
            if t.cert_file.is_some() != t.key_file.is_some() {
                return Err("a client certificate needs both a certificate and a key file".into());
            }
        }
        let port = p.port.unwrap_or(4222);
        let user = match &auth {
            Auth::UserPassword(u, _) => format!("{u}@"),
            _ => String::new(),
        };
        Ok(Target {
            server: format!("{}://{}:{port}", p.scheme, p.host_in_url),
            address: format!("{}://{user}{}:{port}", p.scheme, p.host_in_url),
            auth,
            tls: spec.tls.clone(),
            require_tls,
            connection_name: format!("wasmwatch/{name}"),
        })
    }

    /// The server's address for messages: no password, no token.
    pub(crate) fn address(&self) -> String {
        self.address.clone()
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

/// A connected publisher.
pub(crate) struct Session {
    client: async_nats::Client,
    /// This client's inbox for markers, and the next marker.
    inbox: String,
    markers: async_nats::Subscriber,
    next_marker: u64,
    /// The last `-ERR` the server sent (counted so that a new one is seen).
    errors: Arc<Mutex<(u64, Option<String>)>>,
    /// Flips to false when the client loses its connection.
    connected: watch::Receiver<bool>,
}

impl Session {
    pub(crate) async fn connect(t: &Target) -> Result<Session, Problem> {
        let mut opts = match &t.auth {
            Auth::None => ConnectOptions::new(),
            Auth::UserPassword(u, p) => {
                ConnectOptions::with_user_and_password(u.clone(), p.clone())
            }
            Auth::Token(tok) => ConnectOptions::with_token(tok.clone()),
            Auth::NKey(seed) => ConnectOptions::with_nkey(seed.clone()),
            Auth::Creds(text) => ConnectOptions::with_credentials(text)
                .map_err(|e| Problem::Connect(format!("credentials: {e}")))?,
        };
        if let Some(tls) = &t.tls {
            if let Some(ca) = &tls.ca_file {
                opts = opts.add_root_certificates(ca.clone());
            }
            if let (Some(c), Some(k)) = (&tls.cert_file, &tls.key_file) {
                opts = opts.add_client_certificate(c.clone(), k.clone());
            }
        }
        let errors: Arc<Mutex<(u64, Option<String>)>> = Arc::default();
        let (tx, connected) = watch::channel(true);
        let seen = errors.clone();
        opts = opts
            .name(&t.connection_name)
            .require_tls(t.require_tls || t.tls.is_some())
            // The caller's stage timeout bounds connecting.
            .connection_timeout(Duration::from_secs(60))
            .ignore_discovered_servers()
            .event_callback(move |event| {
                let seen = seen.clone();
                let tx = tx.clone();
                async move {
                    match event {
                        Event::Disconnected | Event::Closed => {
                            let _ = tx.send(false);
                        }
                        Event::Connected => {
                            let _ = tx.send(true);
                        }
                        Event::ServerError(e) => {
                            let text = match e {
                                ServerError::AuthorizationViolation => {
                                    "Authorization Violation".to_string()
                                }
                                ServerError::SlowConsumer(_) => return,
                                ServerError::Other(s) => s,
                            };
                            let mut g = seen.lock().unwrap_or_else(|p| p.into_inner());
                            g.0 += 1;
                            g.1 = Some(text);
                        }
                        _ => {}
                    }
                }
            });
        let client = opts
            .connect(t.server.as_str())
            .await
            .map_err(|e| match e.kind() {
                // The server's -ERR says no more than this: the hint is ours.
                ConnectErrorKind::AuthorizationViolation => Problem::Refused {
                    text: format!("Authorization Violation ({})", t.auth.refusal_hint()),
                    retryable: false,
                },
                ConnectErrorKind::Authentication => Problem::Refused {
                    text: format!("{e} ({})", t.auth.refusal_hint()),
                    retryable: false,
                },
                _ => Problem::Connect(e.to_string()),
            })?;
        let inbox = client.new_inbox();
        let markers = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Problem::Connect(format!("subscribing to its inbox: {e}")))?;
        Ok(Session {
            client,
            inbox,
            markers,
            next_marker: 0,
            errors,
            connected,
        })
    }

    pub(crate) async fn usable(&mut self) -> bool {
        *self.connected.borrow()
            && self.client.connection_state() == async_nats::connection::State::Connected
    }

    pub(crate) async fn publish(&mut self, msg: &Message<'_>) -> Result<(), Problem> {
        let subject = subject(msg)?.to_string();
        let max = self.client.server_info().max_payload;
        let header_bytes: usize = msg
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.len() + 4)
            .sum::<usize>()
            + if msg.headers.is_empty() { 0 } else { 12 };
        let total = msg.payload.len() + header_bytes;
        if max > 0 && total > max {
            return Err(too_big(total, max));
        }
        let errors_before = self.errors.lock().unwrap_or_else(|p| p.into_inner()).0;
        let stats = self.client.statistics();
        let connects = stats.connects.load(std::sync::atomic::Ordering::SeqCst);
        let payload = Bytes::copy_from_slice(msg.payload);
        let sent = if msg.headers.is_empty() {
            self.client.publish(subject, payload).await
        } else {
            let mut headers = HeaderMap::new();
            for h in msg.headers {
                headers.append(h.name.as_str(), h.value.as_str());
            }
            self.client
                .publish_with_headers(subject, headers, payload)
                .await
        };
        // The client refuses a subject or size it cannot send: nothing was
        // sent and a retry cannot change it.
        sent.map_err(|e| match e.kind() {
            PublishErrorKind::MaxPayloadExceeded | PublishErrorKind::InvalidSubject => {
                Problem::Invalid(e.to_string())
            }
            PublishErrorKind::Send => Problem::Broken(e.to_string()),
        })?;
        // The marker's return answers after the message was processed; a
        // lost connection ends the wait at once.
        self.next_marker += 1;
        let marker = self.next_marker.to_string();
        self.client
            .publish(self.inbox.clone(), Bytes::from(marker.clone()))
            .await
            .map_err(|e| Problem::Broken(e.to_string()))?;
        let mut connected = self.connected.clone();
        let back = async {
            use futures_util::StreamExt;
            while let Some(m) = self.markers.next().await {
                if m.payload == marker.as_bytes() {
                    return Ok(());
                }
            }
            Err(Problem::Broken("the client closed".into()))
        };
        tokio::select! {
            r = back => r?,
            _ = connected.wait_for(|c| !*c) => {
                return Err(Problem::Broken("the connection was lost".into()));
            }
        }
        // async-nats reconnects by itself: a PONG on a newer connection says
        // nothing of a message written to the one that died.
        if stats.connects.load(std::sync::atomic::Ordering::SeqCst) != connects {
            return Err(Problem::Broken(
                "the connection was replaced during the publish".into(),
            ));
        }
        // The event callback runs on another task: give it a moment to
        // record an -ERR that came in before the PONG.
        tokio::task::yield_now().await;
        let g = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 != errors_before
            && let Some(text) = &g.1
        {
            return Err(server_error(text));
        }
        Ok(())
    }
}

fn too_big(size: usize, max: usize) -> Problem {
    Problem::Invalid(format!(
        "the message takes {size} bytes, more than the server's max_payload ({max})"
    ))
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
}
