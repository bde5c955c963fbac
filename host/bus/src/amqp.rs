//! AMQP 0-9-1 (RabbitMQ) on `lapin`: one connection and one channel in
//! confirm mode per bus.
//!
//! ```text
//! connect: lapin connect (PLAIN or EXTERNAL, heartbeats as the URL says,
//!          TLS with rustls) ─▶ channel ─▶ confirm.select
//! publish: [exchange.declare passive; if 404: new channel, declare durable
//!          topic] ─▶ basic.publish (mandatory, persistent) ─▶ its confirm
//! ```
//!
//! lapin owns the wire protocol, heartbeats, flow control and
//! `connection.blocked`; this module maps its outcomes to [`Problem`]s. A
//! connection the broker blocks (a resource alarm) fails a publish at once as
//! retryable, so the delivery pipeline retries it later or dead-letters it.
use std::collections::HashSet;
use std::path::Path;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::BasicProperties;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{
    AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo, SASLMechanism,
};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ErrorKind, ExchangeKind};
use tracing::{debug, info, warn};
use wasmwatch_core::manifest::AmqpSpec;

use crate::{Message, Problem, parse_url, read_secret};

/// Where and how to connect.
pub(crate) struct Target {
    uri: AMQPUri,
    tls: OwnedTLSConfig,
    address: String,
    /// Shown by the broker (management UI) as the connection's name.
    connection_name: String,
    /// Logs in with the client certificate (SASL EXTERNAL).
    external: bool,
}

impl Target {
    /// `amqp[s]://[user[:password]@]host[:port][/vhost][?query]`, as in
    /// RabbitMQ's URI spec: default user and password `guest`, ports 5672
    /// and 5671, vhost `/` when the path is empty or `/` (`%2F` also names
    /// it). Query: `heartbeat` (seconds, 0 = off; default: the broker's),
    /// `connection_timeout` (ms), `auth_mechanism` (`plain` or `external`,
    /// with a client certificate), and for amqps `cacertfile`, `certfile`,
    /// `keyfile` (PEM), which the spec's `tls` block can also name.
    pub(crate) fn parse(spec: &AmqpSpec, name: &str) -> Result<Target, String> {
        let url = &spec.url;
        let p = parse_url(url)?;
        let scheme = match p.scheme.as_str() {
            "amqp" => AMQPScheme::AMQP,
            "amqps" => AMQPScheme::AMQPS,
            _ => return Err(format!("{url:?} must start with amqp:// or amqps://")),
        };
        let tls_url = scheme == AMQPScheme::AMQPS;
        let mut query = AMQPQueryString::default();
        let (mut ca, mut cert, mut key) = (None, None, None);
        if let Some(t) = &spec.tls {
            (ca, cert, key) = (t.ca_file.clone(), t.cert_file.clone(), t.key_file.clone());
        }
        let number = |k: &str, v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("URL query parameter {k}={v:?} is not a number"))
        };
        for (k, v) in &p.query {
            match k.as_str() {
                "heartbeat" => {
                    query.heartbeat = Some(
                        u16::try_from(number(k, v)?)
                            .map_err(|_| format!("heartbeat={v} is over 65535 seconds"))?,
                    )
                }
                "connection_timeout" => query.connection_timeout = Some(number(k, v)?),
                "auth_mechanism" => {
                    query.auth_mechanism = Some(match v.to_ascii_lowercase().as_str() {
                        "plain" => SASLMechanism::Plain,
                        "external" => SASLMechanism::External,
                        _ => {
                            return Err(format!(
                                "auth_mechanism={v:?} is not supported (plain, external)"
                            ));
                        }
                    })
                }
                "cacertfile" | "certfile" | "keyfile" if !tls_url => {
                    return Err(format!("{k} is only for amqps:// URLs"));
                }
                "cacertfile" => ca = Some(v.into()),
                "certfile" => cert = Some(v.into()),
                "keyfile" => key = Some(v.into()),
                _ => {
                    return Err(format!(
                        "unsupported URL query parameter {k:?} (supported: heartbeat, \
                         connection_timeout, auth_mechanism, and with amqps cacertfile, \
                         certfile, keyfile)"
                    ));
                }
            }
        }
        if spec.tls.is_some() && !tls_url {
            return Err("tls is only for amqps:// URLs".into());
        }
        let read = |what: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
        };
        let mut tls = OwnedTLSConfig::default();
        if let Some(ca) = &ca {
            let pem = String::from_utf8(read("CA certificates", ca)?)
                .map_err(|_| format!("{} is not PEM text", ca.display()))?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(format!("no CA certificate found in {}", ca.display()));
            }
            tls.cert_chain = Some(pem);
        }
        match (&cert, &key) {
            (Some(c), Some(k)) => {
                tls.identity = Some(OwnedIdentity::PKCS8 {
                    pem: read("client certificate", c)?,
                    key: read("client key", k)?,
                })
            }
            (None, None) => {}
            _ => return Err("a client certificate needs both a certificate and a key file".into()),
        }
        // RabbitMQ's EXTERNAL login is the TLS client certificate: without
        // one it can never succeed.
        if query.auth_mechanism == Some(SASLMechanism::External) {
            if !tls_url {
                return Err("auth_mechanism=external needs an amqps:// URL".into());
            }
            if tls.identity.is_none() {
                return Err("auth_mechanism=external needs a client certificate \
                     (tls.certFile and tls.keyFile, or certfile and keyfile in the URL)"
                    .into());
            }
        }
        let external = query.auth_mechanism == Some(SASLMechanism::External);
        let user_in_url = p.user.is_some();
        let username = p.user.unwrap_or_else(|| "guest".into());
        let password = match &spec.password_file {
            Some(f) => read_secret(f)?,
            None => p.password.unwrap_or_else(|| "guest".into()),
        };
        let port = p.port.unwrap_or(if tls_url { 5671 } else { 5672 });
        let vhost = p.path.unwrap_or_else(|| "/".into());
        let shown_user = if user_in_url {
            format!("{username}@")
        } else {
            String::new()
        };
        let address = format!(
            "{}://{shown_user}{}:{port}/{}",
            if tls_url { "amqps" } else { "amqp" },
            p.host_in_url,
            vhost.replace('%', "%25").replace('/', "%2F")
        );
        Ok(Target {
            uri: AMQPUri {
                scheme,
                authority: AMQPAuthority {
                    userinfo: AMQPUserInfo { username, password },
                    host: p.host,
                    port,
                },
                vhost,
                query,
            },
            tls,
            address,
            connection_name: format!("wasmwatch/{name}"),
            external,
        })
    }

    /// The broker's address for messages: no password.
    pub(crate) fn address(&self) -> String {
        self.address.clone()
    }
}

/// Refuses what AMQP cannot carry, before anything is sent.
pub(crate) fn check(msg: &Message<'_>) -> Result<(), Problem> {
    let long = |what: &str, s: &str| {
        Problem::Invalid(format!(
            "{what} {s:?} is longer than AMQP's 255 bytes ({} bytes)",
            s.len()
        ))
    };
    if msg.destination.len() > 255 {
        return Err(long("exchange", msg.destination));
    }
    if msg.routing_key.len() > 255 {
        return Err(long("routing key", msg.routing_key));
    }
    for h in msg.headers {
        if h.name.len() > 255 {
            return Err(long("header name", &h.name));
        }
    }
    Ok(())
}

/// A lapin error as a [`Problem`]. Broker refusals keep their reply code:
/// access refused, not found, precondition failed, content too large, not
/// allowed (e.g. vhost) and not implemented are permanent; the rest (320
/// connection forced, 5xx server errors, 405 resource locked) may pass.
fn problem(e: lapin::Error, connecting: bool) -> Problem {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => {
            let code = amqp.get_id();
            Problem::Refused {
                text: format!("closed by the broker: {code} {}", amqp.get_message()),
                retryable: !matches!(code, 311 | 403 | 404 | 406 | 530 | 540),
            }
        }
        ErrorKind::AuthProviderError(text) => Problem::Refused {
            text: text.clone(),
            retryable: false,
        },
        _ if connecting => Problem::Connect(e.to_string()),
        _ => Problem::Broken(e.to_string()),
    }
}

/// A TLS alert with which the broker refused this client's certificate (or
/// its absence), as a refusal that a retry cannot change; None for other
/// failures.
fn client_certificate_refused(error: &str) -> Option<String> {
    const ALERT: &str = "received fatal alert: ";
    let alert = &error[error.find(ALERT)? + ALERT.len()..];
    let alert = alert.split(|c: char| !c.is_alphanumeric()).next()?;
    let why = match alert {
        "CertificateRequired" => {
            "it requires a client certificate and none was given \
             (tls.certFile and tls.keyFile)"
        }
        "HandshakeFailure" => {
            "no client certificate given while it requires one \
             (tls.certFile and tls.keyFile), or no common TLS version or cipher"
        }
        "UnknownCA" => "the client certificate is not signed by a CA it trusts",
        "BadCertificate" | "UnsupportedCertificate" => "the client certificate is not valid",
        "CertificateExpired" => "the client certificate has expired",
        "CertificateRevoked" => "the client certificate was revoked",
        "AccessDenied" => "the client certificate is not allowed",
        _ => return None,
    };
    Some(format!(
        "the broker refused the TLS connection ({ALERT}{alert}): {why}"
    ))
}

/// A publishing connection: a channel in confirm mode.
pub(crate) struct Session {
    conn: Connection,
    channel: Channel,
    /// Exchanges known to exist on this connection.
    exchanges: HashSet<String>,
}

impl Target {
    /// A lapin connection to the broker.
    pub(crate) async fn connect(&self) -> Result<Connection, Problem> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let runtime = lapin::runtime::default_runtime().map_err(|e| problem(e, true))?;
        Connection::connect_uri_with_config(self.uri.clone(), props, self.tls.clone(), runtime)
            .await
            .map_err(|e| self.login_problem(problem(e, true)))
    }

    /// Says what a failed connection most likely means for logging in.
    fn login_problem(&self, p: Problem) -> Problem {
        match p {
            Problem::Connect(s) => {
                if let Some(refusal) = client_certificate_refused(&s) {
                    return Problem::Refused {
                        text: refusal,
                        retryable: false,
                    };
                }
                // RabbitMQ closes the socket (no connection.close) on a
                // SASL mechanism it does not offer, and on a bad password
                // when the client does not ask for
                // authentication_failure_close.
                if ["reset", "closed", "aborted"].iter().any(|w| s.contains(w)) {
                    let hint = if self.external {
                        "the broker may not offer EXTERNAL: rabbitmq_auth_mechanism_ssl \
                         plugin, auth_mechanisms"
                    } else {
                        "wrong user or password, or the broker does not offer PLAIN \
                         (e.g. only EXTERNAL: add auth_mechanism=external and a client \
                         certificate)?"
                    };
                    return Problem::Connect(format!("{s} during the handshake ({hint})"));
                }
                Problem::Connect(s)
            }
            Problem::Refused { text, retryable } if self.external && text.contains(" 403 ") => {
                Problem::Refused {
                    text: format!(
                        "{text} (no user named like the client certificate's subject, \
                         or it may not use this vhost)"
                    ),
                    retryable,
                }
            }
            p => p,
        }
    }
}

impl Session {
    pub(crate) async fn connect(t: &Target) -> Result<Session, Problem> {
        let conn = t.connect().await?;
        let channel = Self::channel(&conn).await?;
        Ok(Session {
            conn,
            channel,
            exchanges: HashSet::new(),
        })
    }

    async fn channel(conn: &Connection) -> Result<Channel, Problem> {
        let channel = conn.create_channel().await.map_err(|e| problem(e, true))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| problem(e, true))?;
        Ok(channel)
    }

    /// Whether the connection and channel are still open.
    pub(crate) async fn usable(&mut self) -> bool {
        let ok = self.conn.status().connected() && self.channel.status().connected();
        if !ok {
            debug!("AMQP connection not reusable");
        }
        ok
    }

    /// Makes sure the exchange exists: passive declare, and if it is missing
    /// (404, which closes the channel), a new channel declares it as a
    /// durable topic exchange (as Spring Cloud Stream's binder does).
    async fn ensure_exchange(&mut self, name: &str) -> Result<(), Problem> {
        if name.is_empty() || name.starts_with("amq.") || self.exchanges.contains(name) {
            return Ok(());
        }
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = self
            .channel
            .exchange_declare(
                ShortString::from(name),
                ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            )
            .await;
        match declared.map_err(|e| problem(e, false)) {
            Ok(()) => {}
            Err(Problem::Refused { text, .. }) if text.contains(": 404 ") => {
                self.channel = Self::channel(&self.conn).await?;
                let durable = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                self.channel
                    .exchange_declare(
                        ShortString::from(name),
                        ExchangeKind::Topic,
                        durable,
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| problem(e, false))?;
                info!(exchange = name, "declared AMQP exchange (durable, topic)");
            }
            Err(p) => return Err(p),
        }
        self.exchanges.insert(name.to_string());
        Ok(())
    }

    pub(crate) async fn publish(&mut self, msg: &Message<'_>) -> Result<(), Problem> {
        if self.conn.status().blocked() {
            return Err(Problem::Refused {
                text: "the broker blocks publishers (resource alarm)".into(),
                retryable: true,
            });
        }
        self.ensure_exchange(msg.destination).await?;
        let mut headers = FieldTable::default();
        for h in msg.headers {
            headers.insert(
                ShortString::from(h.name.as_str()),
                AMQPValue::LongString(LongString::from(h.value.as_str())),
            );
        }
        let mut properties = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2);
        if !msg.headers.is_empty() {
            properties = properties.with_headers(headers);
        }
        let confirm = self
            .channel
            .basic_publish(
                ShortString::from(msg.destination),
                ShortString::from(msg.routing_key),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                msg.payload,
                properties,
            )
            .await
            .map_err(|e| problem(e, false))?;
        match confirm.await.map_err(|e| problem(e, false))? {
            Confirmation::Ack(returned) => {
                if let Some(r) = returned {
                    warn!(
                        exchange = msg.destination,
                        routing_key = msg.routing_key,
                        reason = %format!("{} {}", r.reply_code, r.reply_text),
                        "the message reached no queue (nobody subscribed?)"
                    );
                }
                Ok(())
            }
            Confirmation::Nack(_) => Err(Problem::Nack),
            Confirmation::NotRequested => {
                Err(Problem::Broken("the channel is not in confirm mode".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::client_certificate_refused;

    #[test]
    fn tls_alerts_about_the_client_certificate_are_refusals() {
        let r = client_certificate_refused("IO error: received fatal alert: CertificateRequired")
            .unwrap();
        assert!(r.contains("requires a client certificate"), "{r}");
        let r = client_certificate_refused("IO error: received fatal alert: UnknownCA").unwrap();
        assert!(r.contains("CA it trusts"), "{r}");
        assert!(
            client_certificate_refused("IO error: received fatal alert: DecodeError").is_none()
        );
        assert!(client_certificate_refused("IO error: connection refused").is_none());
    }
}
