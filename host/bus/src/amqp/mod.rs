//! An AMQP 0-9-1 publisher (RabbitMQ) over one connection and one channel.
//!
//! ```text
//! connect: protocol header ─▶ start / start-ok (PLAIN) ─▶ tune / tune-ok
//!          (frame-max from the server, heartbeats off) ─▶ open ─▶ channel 1
//!          ─▶ confirm.select
//! publish: [exchange.declare passive; if 404: reopen channel, declare
//!          durable topic] ─▶ basic.publish (mandatory) + content header +
//!          body frames ─▶ wait for basic.ack / basic.nack of its delivery tag
//! ```
//!
//! Heartbeats are switched off (`heartbeat = 0` in tune-ok): the connection is
//! only used by publishes, and an idle connection that the server or the
//! network dropped is noticed by reading before reuse (a close, end of
//! stream) or by the confirm timeout, and then replaced. `connection.blocked`
//! (a broker resource alarm) fails a publish at once, as retryable.
pub(crate) mod wire;

use std::collections::HashSet;
use std::path::Path;

use tracing::{debug, info, warn};

use crate::io::{Conn, Tls};
use crate::{Message, Problem, parse_url};
use wire::{Enc, Field, Frame, method as m};

/// The channel this crate uses.
pub(crate) const CH: u16 = 1;
/// The frame size asked for when the server sets no limit.
const FRAME_MAX: u32 = 128 * 1024;
/// The largest frame accepted before the limit is negotiated.
const HANDSHAKE_FRAME_MAX: usize = 1 << 20;

/// Where and how to connect.
pub(crate) struct Target {
    scheme: &'static str,
    host: String,
    host_in_url: String,
    port: u16,
    tls: Option<Tls>,
    user: String,
    user_in_url: bool,
    password: String,
    vhost: String,
    /// Shown by the broker (management UI) as the connection's name.
    connection_name: String,
}

impl Target {
    /// `amqp[s]://[user[:password]@]host[:port][/vhost][?cacertfile=PATH]`, as
    /// in RabbitMQ's URI spec: default user and password `guest`, ports 5672
    /// and 5671, vhost `/` when the path is empty or `/` (`%2F` also names
    /// it). `cacertfile` (amqps only): verify the broker against these CA
    /// certificates (PEM) instead of the system's.
    pub(crate) fn parse(url: &str, name: &str) -> Result<Target, String> {
        let p = parse_url(url)?;
        let (scheme, default_port) = match p.scheme.as_str() {
            "amqp" => ("amqp", 5672),
            "amqps" => ("amqps", 5671),
            _ => return Err(format!("{url:?} must start with amqp:// or amqps://")),
        };
        let mut ca_file = None;
        for (k, v) in &p.query {
            match k.as_str() {
                "cacertfile" if scheme == "amqps" => ca_file = Some(v.clone()),
                "cacertfile" => return Err("cacertfile is only for amqps:// URLs".into()),
                _ => {
                    return Err(format!(
                        "unsupported URL query parameter {k:?} (supported: cacertfile, with amqps)"
                    ));
                }
            }
        }
        let tls = if scheme == "amqps" {
            Some(Tls::new(ca_file.as_deref().map(Path::new))?)
        } else {
            None
        };
        Ok(Target {
            scheme,
            host: p.host,
            host_in_url: p.host_in_url,
            port: p.port.unwrap_or(default_port),
            tls,
            user_in_url: p.user.is_some(),
            user: p.user.unwrap_or_else(|| "guest".into()),
            password: p.password.unwrap_or_else(|| "guest".into()),
            vhost: p.path.unwrap_or_else(|| "/".into()),
            connection_name: format!("wasmwatch/{name}"),
        })
    }

    /// The broker's address for messages: no password.
    pub(crate) fn address(&self) -> String {
        let user = if self.user_in_url {
            format!("{}@", self.user)
        } else {
            String::new()
        };
        let vhost = self.vhost.replace('%', "%25").replace('/', "%2F");
        format!(
            "{}://{user}{}:{}/{vhost}",
            self.scheme, self.host_in_url, self.port
        )
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

/// A server's `connection.close` / `channel.close`.
fn refused(scope: &str, code: u16, text: &str) -> Problem {
    // Permanent: access refused, not found, precondition failed, content too
    // large, not allowed (e.g. vhost), not implemented. The rest (320
    // connection forced, 5xx server errors, 405 resource locked) may pass.
    let retryable = !matches!(code, 311 | 403 | 404 | 406 | 530 | 540);
    Problem::Refused {
        text: format!("{scope} closed by the broker: {code} {text}"),
        retryable,
    }
}

fn truncated(what: &str) -> Problem {
    Problem::Broken(format!("malformed {what} from the broker"))
}

fn too_long(_: wire::TooLong) -> Problem {
    Problem::Invalid("a string is longer than AMQP's 255 bytes".into())
}

/// A connection with channel [`CH`] open: the protocol machinery shared by
/// the publisher and the tests' consumer.
pub(crate) struct Client {
    io: Conn,
    frame_max: usize,
    pub(crate) channel_open: bool,
    /// Reply code of the server's last `channel.close`.
    pub(crate) channel_closed_with: Option<u16>,
    /// Why the broker blocks publishers (`connection.blocked`), if it does.
    blocked: Option<String>,
}

impl Client {
    /// Connects, authenticates, opens the vhost and channel [`CH`]. Failures
    /// are [`Problem::Connect`] (or [`Problem::Refused`] when the broker
    /// says no, e.g. a bad password or vhost).
    pub(crate) async fn open(t: &Target) -> Result<Client, Problem> {
        let io = Conn::connect(&t.host, t.port, t.tls.as_ref())
            .await
            .map_err(|e| Problem::Connect(e.to_string()))?;
        let mut c = Client {
            io,
            frame_max: HANDSHAKE_FRAME_MAX,
            channel_open: false,
            channel_closed_with: None,
            blocked: None,
        };
        c.handshake(t).await.map_err(|p| match p {
            Problem::Broken(s) => Problem::Connect(format!("handshake failed: {s}")),
            p => p,
        })?;
        Ok(c)
    }

    async fn handshake(&mut self, t: &Target) -> Result<(), Problem> {
        self.send(wire::PROTOCOL_HEADER).await?;
        let start = self.expect(0, m::CONNECTION_START).await?;
        let mut d = wire::Dec::new(&start);
        let _major = d.u8().map_err(|_| truncated("connection.start"))?;
        let _minor = d.u8().map_err(|_| truncated("connection.start"))?;
        let _server_properties = d.longstr().map_err(|_| truncated("connection.start"))?;
        let mechanisms = d.longstr().map_err(|_| truncated("connection.start"))?;
        let mechanisms = String::from_utf8_lossy(mechanisms);
        if !mechanisms.split(' ').any(|x| x == "PLAIN") {
            return Err(Problem::Refused {
                text: format!(
                    "the broker does not offer PLAIN authentication (offers {mechanisms})"
                ),
                retryable: false,
            });
        }

        let mut e = Enc::method(m::CONNECTION_START_OK);
        e.table(&[
            ("product", Field::Str("wasmwatch")),
            ("version", Field::Str(env!("CARGO_PKG_VERSION"))),
            ("platform", Field::Str("Rust")),
            ("connection_name", Field::Str(&t.connection_name)),
            (
                "capabilities",
                Field::Table(vec![
                    ("publisher_confirms", Field::Bool(true)),
                    ("authentication_failure_close", Field::Bool(true)),
                    ("connection.blocked", Field::Bool(true)),
                ]),
            ),
        ])
        .map_err(too_long)?;
        e.shortstr("PLAIN").map_err(too_long)?;
        let mut response = Vec::with_capacity(t.user.len() + t.password.len() + 2);
        response.push(0);
        response.extend_from_slice(t.user.as_bytes());
        response.push(0);
        response.extend_from_slice(t.password.as_bytes());
        e.longstr(&response);
        e.shortstr("en_US").map_err(too_long)?;
        self.send_method(0, e).await?;

        let tune = match self
            .expect_any(0, &[m::CONNECTION_TUNE, m::CONNECTION_SECURE])
            .await
        {
            Ok((m::CONNECTION_TUNE, args)) => args,
            Ok(_) => {
                return Err(Problem::Refused {
                    text: "the broker asked for a SASL challenge, which PLAIN does not have".into(),
                    retryable: false,
                });
            }
            Err(Problem::Broken(s)) => {
                return Err(Problem::Broken(format!(
                    "{s} after authentication (wrong user or password?)"
                )));
            }
            Err(p) => return Err(p),
        };
        let mut d = wire::Dec::new(&tune);
        let _channel_max = d.u16().map_err(|_| truncated("connection.tune"))?;
        let frame_max = d.u32().map_err(|_| truncated("connection.tune"))?;
        // 0 means no limit; 4096 is the protocol's minimum.
        let frame_max = if frame_max == 0 {
            FRAME_MAX
        } else {
            frame_max.clamp(4096, 1 << 20)
        };
        self.frame_max = frame_max as usize;
        let mut e = Enc::method(m::CONNECTION_TUNE_OK);
        e.u16(1).u32(frame_max).u16(0);
        self.send_method(0, e).await?;

        let mut e = Enc::method(m::CONNECTION_OPEN);
        e.shortstr(&t.vhost).map_err(too_long)?;
        e.shortstr("").map_err(too_long)?.u8(0);
        self.send_method(0, e).await?;
        self.expect(0, m::CONNECTION_OPEN_OK).await?;
        self.open_channel().await
    }

    /// Opens channel [`CH`] (again, after the server closed it).
    pub(crate) async fn open_channel(&mut self) -> Result<(), Problem> {
        let mut e = Enc::method(m::CHANNEL_OPEN);
        e.shortstr("").map_err(too_long)?;
        self.send_method(CH, e).await?;
        self.expect(CH, m::CHANNEL_OPEN_OK).await?;
        self.channel_open = true;
        self.channel_closed_with = None;
        Ok(())
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) -> Result<(), Problem> {
        self.io
            .send(bytes)
            .await
            .map_err(|e| Problem::Broken(e.to_string()))
    }

    pub(crate) async fn send_method(&mut self, channel: u16, e: Enc) -> Result<(), Problem> {
        let mut out = Vec::with_capacity(e.0.len() + wire::FRAME_OVERHEAD);
        wire::put_frame(&mut out, wire::FRAME_METHOD, channel, &e.0);
        self.send(&out).await
    }

    /// The next frame, waiting for it.
    async fn next_frame(&mut self) -> Result<Frame, Problem> {
        loop {
            if let Some(f) =
                wire::take_frame(&mut self.io.rbuf, self.frame_max + wire::FRAME_OVERHEAD)
                    .map_err(Problem::Broken)?
            {
                return Ok(f);
            }
            self.io
                .fill()
                .await
                .map_err(|e| Problem::Broken(e.to_string()))?;
        }
    }

    /// Handles what concerns the connection and channel themselves
    /// (heartbeats, closes, flow control, blocking); returns other frames.
    async fn handle(&mut self, f: Frame) -> Result<Option<Frame>, Problem> {
        if f.kind == wire::FRAME_HEARTBEAT {
            return Ok(None);
        }
        let Some((id, args)) = f.method() else {
            return Ok(Some(f));
        };
        match id {
            m::CONNECTION_CLOSE if f.channel == 0 => {
                let (code, text) = close_args(args)?;
                // Best effort: the connection is over either way.
                let _ = self
                    .send_method(0, Enc::method(m::CONNECTION_CLOSE_OK))
                    .await;
                Err(refused("connection", code, &text))
            }
            m::CONNECTION_BLOCKED if f.channel == 0 => {
                let reason = wire::Dec::new(args).shortstr().unwrap_or_default();
                warn!(%reason, "the AMQP broker blocks publishers (resource alarm)");
                self.blocked = Some(reason);
                Ok(None)
            }
            m::CONNECTION_UNBLOCKED if f.channel == 0 => {
                info!("the AMQP broker accepts publishers again");
                self.blocked = None;
                Ok(None)
            }
            m::CHANNEL_CLOSE if f.channel == CH => {
                let (code, text) = close_args(args)?;
                self.send_method(CH, Enc::method(m::CHANNEL_CLOSE_OK))
                    .await?;
                self.channel_open = false;
                self.channel_closed_with = Some(code);
                Err(refused("channel", code, &text))
            }
            m::CHANNEL_FLOW if f.channel == CH => {
                let active = args.first().copied().unwrap_or(1) & 1;
                let mut e = Enc::method(m::CHANNEL_FLOW_OK);
                e.u8(active);
                self.send_method(CH, e).await?;
                Ok(None)
            }
            _ => Ok(Some(f)),
        }
    }

    /// The next frame the caller has to deal with.
    pub(crate) async fn next_event(&mut self) -> Result<Frame, Problem> {
        loop {
            let f = self.next_frame().await?;
            if let Some(f) = self.handle(f).await? {
                return Ok(f);
            }
        }
    }

    /// Waits for one of the `wanted` methods on `channel`, skipping anything
    /// else; returns which one and its arguments.
    async fn expect_any(
        &mut self,
        channel: u16,
        wanted: &[(u16, u16)],
    ) -> Result<((u16, u16), Vec<u8>), Problem> {
        loop {
            let f = self.next_event().await?;
            if f.channel != channel {
                continue;
            }
            if let Some((id, args)) = f.method()
                && wanted.contains(&id)
            {
                return Ok((id, args.to_vec()));
            }
        }
    }

    pub(crate) async fn expect(
        &mut self,
        channel: u16,
        wanted: (u16, u16),
    ) -> Result<Vec<u8>, Problem> {
        Ok(self.expect_any(channel, &[wanted]).await?.1)
    }

    /// Sends a method on [`CH`] and waits for its answer.
    pub(crate) async fn call(&mut self, e: Enc, answer: (u16, u16)) -> Result<Vec<u8>, Problem> {
        self.send_method(CH, e).await?;
        self.expect(CH, answer).await
    }

    /// Processes what arrived while idle, without waiting. An error means
    /// the connection cannot be used.
    async fn drain(&mut self) -> Result<(), Problem> {
        loop {
            while let Some(f) =
                wire::take_frame(&mut self.io.rbuf, self.frame_max + wire::FRAME_OVERHEAD)
                    .map_err(Problem::Broken)?
            {
                self.handle(f).await?;
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
}

fn close_args(args: &[u8]) -> Result<(u16, String), Problem> {
    let mut d = wire::Dec::new(args);
    let code = d.u16().map_err(|_| truncated("close"))?;
    let text = d.shortstr().map_err(|_| truncated("close"))?;
    Ok((code, text))
}

/// A publishing connection: a [`Client`] in confirm mode.
pub(crate) struct Session {
    client: Client,
    /// The delivery tag the broker gives the next publish.
    next_tag: u64,
    /// Exchanges known to exist on this connection.
    exchanges: HashSet<String>,
}

impl Session {
    pub(crate) async fn connect(t: &Target) -> Result<Session, Problem> {
        let client = Client::open(t).await?;
        let mut s = Session {
            client,
            next_tag: 1,
            exchanges: HashSet::new(),
        };
        s.confirm_select().await.map_err(|p| match p {
            Problem::Broken(s) => Problem::Connect(format!("handshake failed: {s}")),
            p => p,
        })?;
        Ok(s)
    }

    async fn confirm_select(&mut self) -> Result<(), Problem> {
        let mut e = Enc::method(m::CONFIRM_SELECT);
        e.u8(0); // wait for select-ok
        self.client.call(e, m::CONFIRM_SELECT_OK).await?;
        self.next_tag = 1;
        Ok(())
    }

    pub(crate) async fn usable(&mut self) -> bool {
        match self.client.drain().await {
            Ok(()) => self.client.channel_open,
            Err(p) => {
                debug!(problem = %p, "AMQP connection not reusable");
                false
            }
        }
    }

    /// Makes sure the exchange exists: passive declare, and if it is missing
    /// (404, which closes the channel), reopen the channel and declare it as
    /// a durable topic exchange.
    async fn ensure_exchange(&mut self, name: &str) -> Result<(), Problem> {
        if name.is_empty() || name.starts_with("amq.") || self.exchanges.contains(name) {
            return Ok(());
        }
        let declare = |passive: bool| -> Result<Enc, Problem> {
            let mut e = Enc::method(m::EXCHANGE_DECLARE);
            e.u16(0);
            e.shortstr(name).map_err(too_long)?;
            e.shortstr("topic").map_err(too_long)?;
            // bits: passive, durable, auto-delete, internal, no-wait
            e.u8(if passive { 0b01 } else { 0b10 });
            e.table(&[]).map_err(too_long)?;
            Ok(e)
        };
        match self
            .client
            .call(declare(true)?, m::EXCHANGE_DECLARE_OK)
            .await
        {
            Ok(_) => {}
            Err(_) if self.client.channel_closed_with == Some(404) => {
                self.client.open_channel().await?;
                self.confirm_select().await?;
                self.client
                    .call(declare(false)?, m::EXCHANGE_DECLARE_OK)
                    .await?;
                info!(exchange = name, "declared AMQP exchange (durable, topic)");
            }
            Err(p) => return Err(p),
        }
        self.exchanges.insert(name.to_string());
        Ok(())
    }

    pub(crate) async fn publish(&mut self, msg: &Message<'_>) -> Result<(), Problem> {
        if let Some(reason) = &self.client.blocked {
            return Err(Problem::Refused {
                text: format!("the broker blocks publishers (resource alarm: {reason})"),
                retryable: true,
            });
        }
        self.ensure_exchange(msg.destination).await?;

        let headers: Vec<(&str, Field<'_>)> = msg
            .headers
            .iter()
            .map(|h| (h.name.as_str(), Field::Str(&h.value)))
            .collect();
        let header =
            wire::encode_content_header(msg.payload.len() as u64, "application/json", &headers)
                .map_err(too_long)?;
        let chunk = self.client.frame_max - wire::FRAME_OVERHEAD;
        if header.len() > chunk {
            return Err(Problem::Invalid(format!(
                "the headers take {} bytes, more than the broker's frame size allows ({chunk})",
                header.len()
            )));
        }
        let mut e = Enc::method(m::BASIC_PUBLISH);
        e.u16(0);
        e.shortstr(msg.destination).map_err(too_long)?;
        e.shortstr(msg.routing_key).map_err(too_long)?;
        e.u8(0b01); // mandatory, not immediate

        let mut out = Vec::with_capacity(msg.payload.len() + header.len() + e.0.len() + 64);
        wire::put_frame(&mut out, wire::FRAME_METHOD, CH, &e.0);
        wire::put_frame(&mut out, wire::FRAME_HEADER, CH, &header);
        for body in msg.payload.chunks(chunk) {
            wire::put_frame(&mut out, wire::FRAME_BODY, CH, body);
        }
        self.client.send(&out).await?;
        let tag = self.next_tag;
        self.next_tag += 1;

        let mut returned = None;
        loop {
            let f = self.client.next_event().await?;
            if f.channel != CH {
                continue;
            }
            let Some((id, args)) = f.method() else {
                continue; // the content of a returned message
            };
            match id {
                m::BASIC_ACK | m::BASIC_NACK => {
                    let mut d = wire::Dec::new(args);
                    let acked = d.u64().map_err(|_| truncated("basic.ack"))?;
                    let multiple = d.u8().map_err(|_| truncated("basic.ack"))? & 1 == 1;
                    if acked != tag && !(multiple && acked >= tag) {
                        continue;
                    }
                    if id == m::BASIC_NACK {
                        return Err(Problem::Nack);
                    }
                    if let Some(text) = returned {
                        warn!(
                            exchange = msg.destination,
                            routing_key = msg.routing_key,
                            reason = %text,
                            "the message reached no queue (nobody subscribed?)"
                        );
                    }
                    return Ok(());
                }
                m::BASIC_RETURN => {
                    let (code, text) = close_args(args)?;
                    returned = Some(format!("{code} {text}"));
                }
                _ => {}
            }
        }
    }
}
