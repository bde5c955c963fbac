//! Bus connections named in the manifest (`buses:`), owned by the host:
//! plugins only name a connection in a `publish` action.
//!
//! ```text
//! Buses::new(&manifest.buses)   validate URLs, connect nothing
//! Buses::publish(name, destination, routing_key, headers, payload)
//!     ─▶ the named bus's session (one connection per bus, made on first use,
//!        remade after a failure) ─▶ Ok once the broker has the message
//! ```
//!
//! The protocols are the ecosystem's clients, `lapin` (AMQP 0-9-1) and
//! `async-nats`, both on rustls with ring (no system OpenSSL); this crate is
//! the glue: URLs and secrets, sessions, timeouts and error classification.
//!
//! ## Semantics
//!
//! - **AMQP 0-9-1** (RabbitMQ): `destination` is the exchange, `routing_key`
//!   the routing key, headers become AMQP headers (string values), the
//!   message is persistent with content type `application/json`. The
//!   exchange is checked with a passive declare on first use per connection
//!   and, if missing, declared as a durable topic exchange (as Spring Cloud
//!   Stream's binder declares `springCloudBus`); an existing exchange of any
//!   type is used as it is. The default exchange (`""`) and `amq.*` are never
//!   declared. Publisher confirms: `publish` returns `Ok` only after the
//!   broker's `basic.ack`. Messages are published `mandatory`: an unroutable
//!   message (no queue bound, e.g. no Spring app listening yet) is logged as
//!   a warning and still counts as delivered, since retrying cannot route it.
//! - **NATS**: the subject is `destination`, or `routing_key` when
//!   `destination` is empty (so a plugin written for AMQP-style routing still
//!   works); `PUB`, or `HPUB` when there are headers. `publish` returns after
//!   the server answered the `PING` sent behind the message, i.e. after the
//!   server processed it (core NATS has no stronger acknowledgement).
//!
//! ## Connections, failures, timeouts
//!
//! One connection per named bus, made on the first publish, so start-up does
//! not depend on brokers. Publishes on one bus are serialised over it (one in
//! flight, each waits for its confirm: one round trip per message, plenty for
//! configuration changes). Any failure drops the
//! connection; the next publish connects again. Before reusing an idle
//! connection, what the server sent meanwhile is read without waiting (a
//! close, a `PING`), and a reused connection that turns out broken is
//! replaced once, transparently, within the same publish.
//!
//! Each stage has a timeout ([`DEFAULT_TIMEOUT`], see [`Buses::with_timeout`]):
//! waiting for the previous publish on the bus, connecting (TCP, TLS,
//! handshake), and publishing up to the confirm. A dead broker gives a
//! retryable error, never a hang.
//!
//! [`PublishError::retryable`]: an unknown connection name, an invalid message
//! (e.g. a NATS subject with spaces, a payload over the server's limit) and
//! refusals that a retry cannot change (AMQP 403 access refused, e.g. wrong
//! credentials, 404, 406, 530; a TLS alert refusing the client certificate
//! or its absence; NATS authorization and permission violations) are
//! permanent; connection failures, lost connections, nacks,
//! timeouts and other refusals (e.g. 320 connection forced at a broker
//! shutdown) are retryable. Every message names the connection and the
//! broker's address (never its password).
#![forbid(unsafe_code)]

mod amqp;
mod nats;
#[doc(hidden)]
pub mod testing;

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tracing::{debug, info, warn};
use wasmwatch_core::action::Header;
use wasmwatch_core::manifest::BusConnection;

/// How long each stage of a publish may take (see the crate docs).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The manifest's bus connections, by name. `Send + Sync`: share it (e.g. in
/// an `Arc`) and publish from many tasks at once.
pub struct Buses {
    buses: HashMap<String, Bus>,
}

impl fmt::Debug for Buses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.buses.values().map(|b| (&b.name, &b.address)).collect();
        names.sort();
        f.debug_struct("Buses").field("buses", &names).finish()
    }
}

/// A bus connection the manifest defines badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bus connection {connection:?}: {problem}")]
pub struct BusError {
    pub connection: String,
    pub problem: String,
}

/// Why a publish failed. See [`PublishError::retryable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("bus connection {connection:?} is not defined (defined: {known})")]
    UnknownConnection { connection: String, known: String },
    #[error("bus connection {connection:?} ({address}): {problem}")]
    Failed {
        connection: String,
        /// The broker's address, without password.
        address: String,
        problem: Problem,
    },
}

impl PublishError {
    /// Whether trying again later can succeed.
    pub fn retryable(&self) -> bool {
        match self {
            PublishError::UnknownConnection { .. } => false,
            PublishError::Failed { problem, .. } => problem.retryable(),
        }
    }
}

/// What went wrong on a bus.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// No connection could be made: refused, unknown host, TLS, handshake.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection broke or the server closed it.
    #[error("connection lost: {0}")]
    Broken(String),
    /// No answer in time.
    #[error("no answer within {after:?} {during}")]
    Timeout {
        during: &'static str,
        after: Duration,
    },
    /// The broker did not take the message (AMQP `basic.nack`).
    #[error("the broker refused the message (nack)")]
    Nack,
    /// The server closed the channel or connection with an error (AMQP), or
    /// answered `-ERR` (NATS).
    #[error("refused by the server: {text}")]
    Refused { text: String, retryable: bool },
    /// The message cannot be sent as it is.
    #[error("{0}")]
    Invalid(String),
}

impl Problem {
    pub fn retryable(&self) -> bool {
        match self {
            Problem::Connect(_) | Problem::Broken(_) | Problem::Timeout { .. } | Problem::Nack => {
                true
            }
            Problem::Refused { retryable, .. } => *retryable,
            Problem::Invalid(_) => false,
        }
    }
}

impl Buses {
    /// Checks every connection (exactly one of `amqp`/`nats`, a URL this
    /// crate can use, unique names). Connects to nothing.
    pub fn new(connections: &[BusConnection]) -> Result<Buses, BusError> {
        let mut buses = HashMap::new();
        for c in connections {
            let bad = |problem: String| BusError {
                connection: c.name.clone(),
                problem,
            };
            let kind = match (&c.amqp, &c.nats) {
                (Some(a), None) => Kind::Amqp(amqp::Target::parse(a, &c.name).map_err(bad)?),
                (None, Some(n)) => Kind::Nats(nats::Target::parse(n, &c.name).map_err(bad)?),
                _ => return Err(bad("must have exactly one of amqp or nats".into())),
            };
            let address = match &kind {
                Kind::Amqp(t) => t.address(),
                Kind::Nats(t) => t.address(),
            };
            let bus = Bus {
                name: c.name.clone(),
                address,
                timeout: DEFAULT_TIMEOUT,
                kind,
                session: tokio::sync::Mutex::new(None),
            };
            if buses.insert(c.name.clone(), bus).is_some() {
                return Err(bad("is defined twice".into()));
            }
        }
        Ok(Buses { buses })
    }

    /// Sets the timeout of each stage of a publish (default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Buses {
        for b in self.buses.values_mut() {
            b.timeout = timeout;
        }
        self
    }

    /// The names of the connections.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.buses.keys().map(String::as_str)
    }

    /// Publishes one message on the named connection and returns once the
    /// broker has it (AMQP: confirmed; NATS: processed by the server).
    pub async fn publish(
        &self,
        connection: &str,
        destination: &str,
        routing_key: &str,
        headers: &[Header],
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let Some(bus) = self.buses.get(connection) else {
            let mut known: Vec<&str> = self.names().collect();
            known.sort();
            let known = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(PublishError::UnknownConnection {
                connection: connection.to_string(),
                known,
            });
        };
        let message = Message {
            destination,
            routing_key,
            headers,
            payload,
        };
        bus.publish(&message)
            .await
            .map_err(|problem| PublishError::Failed {
                connection: bus.name.clone(),
                address: bus.address.clone(),
                problem,
            })
    }
}

/// One message to publish.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message<'a> {
    pub destination: &'a str,
    pub routing_key: &'a str,
    pub headers: &'a [Header],
    pub payload: &'a [u8],
}

struct Bus {
    name: String,
    address: String,
    timeout: Duration,
    kind: Kind,
    /// The connection, when there is a usable one. Held during a publish.
    session: tokio::sync::Mutex<Option<Session>>,
}

enum Kind {
    Amqp(amqp::Target),
    Nats(nats::Target),
}

enum Session {
    Amqp(amqp::Session),
    Nats(nats::Session),
}

impl Bus {
    async fn publish(&self, message: &Message<'_>) -> Result<(), Problem> {
        // Refuse what can never be sent before touching the connection.
        match &self.kind {
            Kind::Amqp(_) => amqp::check(message)?,
            Kind::Nats(_) => nats::check(message)?,
        }
        let after = self.timeout;
        let mut slot = tokio::time::timeout(after, self.session.lock())
            .await
            .map_err(|_| Problem::Timeout {
                during: "waiting for the previous publish on this connection",
                after,
            })?;
        // Taken out of the slot: if this future is dropped half-way, the
        // connection (in an unknown state) is dropped with it.
        let reusable = match slot.take() {
            Some(mut s) => {
                // Let the runtime's I/O driver record what arrived (e.g. the
                // peer's close) before looking without waiting.
                tokio::task::yield_now().await;
                if s.usable().await {
                    Some(s)
                } else {
                    debug!(connection = %self.name, "idle connection closed by the server; reconnecting");
                    None
                }
            }
            None => None,
        };
        let reused = reusable.is_some();
        let mut session = match reusable {
            Some(s) => s,
            None => self.connect().await?,
        };
        let mut result = self.publish_on(&mut session, message).await;
        if reused && matches!(result, Err(Problem::Broken(_))) {
            debug!(connection = %self.name, "reused connection was broken; reconnecting once");
            session = self.connect().await?;
            result = self.publish_on(&mut session, message).await;
        }
        match &result {
            // Nothing was sent for an invalid message: the connection is fine.
            Ok(()) | Err(Problem::Invalid(_)) => *slot = Some(session),
            Err(problem) => {
                warn!(connection = %self.name, address = %self.address, %problem, "dropping the bus connection")
            }
        }
        result
    }

    async fn publish_on(
        &self,
        session: &mut Session,
        message: &Message<'_>,
    ) -> Result<(), Problem> {
        let after = self.timeout;
        let work = async {
            match session {
                Session::Amqp(s) => s.publish(message).await,
                Session::Nats(s) => s.publish(message).await,
            }
        };
        tokio::time::timeout(after, work)
            .await
            .unwrap_or(Err(Problem::Timeout {
                during: "waiting for the broker to take the message",
                after,
            }))
    }

    async fn connect(&self) -> Result<Session, Problem> {
        let after = self.timeout;
        let work = async {
            match &self.kind {
                Kind::Amqp(t) => amqp::Session::connect(t).await.map(Session::Amqp),
                Kind::Nats(t) => nats::Session::connect(t).await.map(Session::Nats),
            }
        };
        let session = tokio::time::timeout(after, work)
            .await
            .unwrap_or(Err(Problem::Timeout {
                during: "connecting",
                after,
            }))?;
        info!(connection = %self.name, address = %self.address, "bus connected");
        Ok(session)
    }
}

impl Session {
    /// Reads what the server sent while the connection was idle; false if
    /// the connection cannot be used any more.
    async fn usable(&mut self) -> bool {
        match self {
            Session::Amqp(s) => s.usable().await,
            Session::Nats(s) => s.usable().await,
        }
    }
}

/// The parts of a bus URL (`scheme://[user[:password]@]host[:port][/path][?query]`).
pub(crate) struct ParsedUrl {
    pub scheme: String,
    pub host: String,
    /// `host` as written in a URL (IPv6 in brackets).
    pub host_in_url: String,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Percent-decoded path without the leading `/`, or None when there is
    /// no path at all (or only `/`).
    pub path: Option<String>,
    pub query: Vec<(String, String)>,
}

pub(crate) fn parse_url(raw: &str) -> Result<ParsedUrl, String> {
    let u = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if u.fragment().is_some() {
        return Err("the URL must not have a #fragment".into());
    }
    let (host, host_in_url) = match u.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => {
            let d = percent_decode(d)?;
            (d.clone(), d)
        }
        Some(url::Host::Ipv4(a)) => (a.to_string(), a.to_string()),
        Some(url::Host::Ipv6(a)) => (a.to_string(), format!("[{a}]")),
        _ => return Err("the URL has no host".into()),
    };
    let user = match u.username() {
        "" => None,
        s => Some(percent_decode(s)?),
    };
    let password = u.password().map(percent_decode).transpose()?;
    let path = match u.path() {
        "" | "/" => None,
        p => {
            let p = p.strip_prefix('/').unwrap_or(p);
            if p.contains('/') {
                return Err(format!(
                    "path {:?} has more than one segment (encode a '/' in a vhost as %2F)",
                    u.path()
                ));
            }
            Some(percent_decode(p)?)
        }
    };
    let query = u
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    Ok(ParsedUrl {
        scheme: u.scheme().to_string(),
        host,
        host_in_url,
        port: u.port(),
        user,
        password,
        path,
        query,
    })
}

/// A secret from a file (a mounted Secret's key): its text without the
/// trailing line break.
pub(crate) fn read_secret(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = text.trim_end_matches(['\r', '\n']);
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(text.to_string())
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmwatch_core::manifest::{AmqpSpec, NatsSpec};

    fn amqp(name: &str, url: &str) -> BusConnection {
        BusConnection {
            name: name.into(),
            amqp: Some(AmqpSpec {
                url: url.into(),
                ..Default::default()
            }),
            nats: None,
        }
    }

    fn nats(name: &str, url: &str) -> BusConnection {
        BusConnection {
            name: name.into(),
            amqp: None,
            nats: Some(NatsSpec {
                url: url.into(),
                ..Default::default()
            }),
        }
    }

    fn problem(c: BusConnection) -> String {
        Buses::new(&[c]).unwrap_err().to_string()
    }

    #[test]
    fn buses_are_send_and_sync_and_publishing_is_send() {
        fn check<T: Send + Sync>() {}
        check::<Buses>();
        check::<PublishError>();
        check::<BusError>();
        fn send<T: Send>(_: T) {}
        let b = Buses::new(&[]).unwrap();
        send(b.publish("a", "b", "c", &[], b""));
    }

    #[test]
    fn valid_urls_are_accepted_and_addresses_hide_passwords() {
        let b = Buses::new(&[
            amqp("a", "amqp://user:s%40cret@rabbit.ns.svc:5673/%2F"),
            amqp("b", "amqps://rabbit"),
            amqp("c", "amqp://[::1]/vhost"),
            nats("n", "nats://nats:4222"),
            nats("t", "nats://tok3n@nats"),
        ])
        .unwrap();
        let dbg = format!("{b:?}");
        assert!(dbg.contains("amqp://user@rabbit.ns.svc:5673/%2F"), "{dbg}");
        assert!(dbg.contains("amqps://rabbit:5671/%2F"), "{dbg}");
        assert!(dbg.contains("amqp://[::1]:5672/vhost"), "{dbg}");
        assert!(dbg.contains("nats://nats:4222"), "{dbg}");
        assert!(
            !dbg.contains("s%40cret") && !dbg.contains("s@cret"),
            "{dbg}"
        );
        assert!(!dbg.contains("tok3n"), "{dbg}");
    }

    #[test]
    fn bad_connections_are_refused_with_their_name() {
        let e = problem(amqp("x", "http://rabbit"));
        assert!(e.contains("\"x\"") && e.contains("amqp://"), "{e}");
        let e = problem(amqp("x", "amqp://"));
        assert!(e.contains("no host"), "{e}");
        let e = problem(amqp("x", "amqp://rabbit/a/b"));
        assert!(e.contains("more than one segment"), "{e}");
        let e = problem(amqp("x", "amqp://rabbit?heartbeat=often"));
        assert!(e.contains("heartbeat"), "{e}");
        let e = problem(amqp("x", "amqp://rabbit?frame=1"));
        assert!(e.contains("\"frame\""), "{e}");
        let e = problem(amqp("x", "amqp://rabbit?cacertfile=/x"));
        assert!(e.contains("amqps"), "{e}");
        let e = problem(amqp("x", "amqps://rabbit?cacertfile=/nonexistent/ca.pem"));
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = problem(amqp("x", "amqps://rabbit?auth_mechanism=external"));
        assert!(e.contains("needs a client certificate"), "{e}");
        let e = problem(amqp("x", "amqp://rabbit?auth_mechanism=external"));
        assert!(e.contains("needs an amqps:// URL"), "{e}");
        let e = problem(nats("y", "nats://nats/sub"));
        assert!(e.contains("\"y\"") && e.contains("path"), "{e}");
        let e = problem(nats("y", "http://nats"));
        assert!(e.contains("nats://"), "{e}");
        let e = problem(BusConnection {
            name: "z".into(),
            amqp: None,
            nats: None,
        });
        assert!(e.contains("exactly one"), "{e}");
        let e = Buses::new(&[nats("d", "nats://a"), nats("d", "nats://b")]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%40").unwrap(), "a/b@");
        assert!(percent_decode("a%2").is_err());
        assert!(percent_decode("%ff").is_err());
    }

    #[tokio::test]
    async fn unknown_connection_is_permanent_and_named() {
        let b = Buses::new(&[nats("events", "nats://127.0.0.1:1")]).unwrap();
        let e = b.publish("nope", "s", "", &[], b"{}").await.unwrap_err();
        assert!(!e.retryable());
        let text = e.to_string();
        assert!(
            text.contains("\"nope\"") && text.contains("events"),
            "{text}"
        );
    }
}
