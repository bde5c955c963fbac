//! For this crate's tests only (not a stable API): a minimal AMQP 0-9-1
//! client that declares queues and fetches messages with `basic.get`, on the
//! same protocol code as the publisher.
use crate::Problem;
use crate::amqp::wire::{self, Enc, method as m};
use crate::amqp::{CH, Client, Target};

pub use crate::amqp::wire::{FieldValue, Properties};

/// A message fetched from a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub exchange: String,
    pub routing_key: String,
    pub properties: Properties,
    pub body: Vec<u8>,
}

/// An AMQP connection for inspecting a broker.
pub struct AmqpTestClient {
    client: Client,
}

fn text(p: Problem) -> String {
    p.to_string()
}

fn too_long(_: wire::TooLong) -> String {
    "name too long".into()
}

impl AmqpTestClient {
    pub async fn connect(url: &str) -> Result<AmqpTestClient, String> {
        let target = Target::parse(url, "test")?;
        let client = Client::open(&target).await.map_err(text)?;
        Ok(AmqpTestClient { client })
    }

    /// Declares a non-durable exchange of the given type.
    pub async fn declare_exchange(&mut self, name: &str, kind: &str) -> Result<(), String> {
        let mut e = Enc::method(m::EXCHANGE_DECLARE);
        e.u16(0);
        e.shortstr(name).map_err(too_long)?;
        e.shortstr(kind).map_err(too_long)?;
        e.u8(0);
        e.table(&[]).map_err(too_long)?;
        self.client
            .call(e, m::EXCHANGE_DECLARE_OK)
            .await
            .map_err(text)?;
        Ok(())
    }

    /// Whether the exchange exists and, if so, is durable with this type:
    /// a passive declare, then an equivalent active one (which fails with
    /// 406 if the type or durability differ).
    pub async fn exchange_is(
        &mut self,
        name: &str,
        kind: &str,
        durable: bool,
    ) -> Result<bool, String> {
        for bits in [0b01, if durable { 0b10 } else { 0 }] {
            let mut e = Enc::method(m::EXCHANGE_DECLARE);
            e.u16(0);
            e.shortstr(name).map_err(too_long)?;
            e.shortstr(kind).map_err(too_long)?;
            e.u8(bits);
            e.table(&[]).map_err(too_long)?;
            if let Err(p) = self.client.call(e, m::EXCHANGE_DECLARE_OK).await {
                if self.client.channel_open {
                    return Err(text(p));
                }
                self.client.open_channel().await.map_err(text)?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub async fn delete_exchange(&mut self, name: &str) -> Result<(), String> {
        let mut e = Enc::method(m::EXCHANGE_DELETE);
        e.u16(0);
        e.shortstr(name).map_err(too_long)?;
        e.u8(0);
        self.client
            .call(e, m::EXCHANGE_DELETE_OK)
            .await
            .map_err(text)?;
        Ok(())
    }

    /// Declares an exclusive, auto-deleted queue and binds it.
    pub async fn queue_bound(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> Result<(), String> {
        let mut e = Enc::method(m::QUEUE_DECLARE);
        e.u16(0);
        e.shortstr(queue).map_err(too_long)?;
        e.u8(0b1100); // exclusive, auto-delete
        e.table(&[]).map_err(too_long)?;
        self.client
            .call(e, m::QUEUE_DECLARE_OK)
            .await
            .map_err(text)?;
        let mut e = Enc::method(m::QUEUE_BIND);
        e.u16(0);
        e.shortstr(queue).map_err(too_long)?;
        e.shortstr(exchange).map_err(too_long)?;
        e.shortstr(key).map_err(too_long)?;
        e.u8(0);
        e.table(&[]).map_err(too_long)?;
        self.client.call(e, m::QUEUE_BIND_OK).await.map_err(text)?;
        Ok(())
    }

    /// Takes the next message off the queue (auto-ack), if there is one.
    pub async fn get(&mut self, queue: &str) -> Result<Option<Delivery>, String> {
        let mut e = Enc::method(m::BASIC_GET);
        e.u16(0);
        e.shortstr(queue).map_err(too_long)?;
        e.u8(1); // no-ack
        self.client.send_method(CH, e).await.map_err(text)?;
        let (exchange, routing_key) = loop {
            let f = self.client.next_event().await.map_err(text)?;
            match f.method() {
                Some((m::BASIC_GET_EMPTY, _)) => return Ok(None),
                Some((m::BASIC_GET_OK, args)) => {
                    let mut d = wire::Dec::new(args);
                    let bad = |_| "malformed get-ok".to_string();
                    d.u64().map_err(bad)?;
                    d.u8().map_err(bad)?;
                    let exchange = d.shortstr().map_err(bad)?;
                    let key = d.shortstr().map_err(bad)?;
                    break (exchange, key);
                }
                _ => {}
            }
        };
        let f = self.client.next_event().await.map_err(text)?;
        if f.kind != wire::FRAME_HEADER {
            return Err(format!(
                "expected a content header, got frame type {}",
                f.kind
            ));
        }
        let (size, properties) =
            wire::decode_content_header(&f.payload).map_err(|_| "malformed content header")?;
        let mut body = Vec::with_capacity(size as usize);
        while (body.len() as u64) < size {
            let f = self.client.next_event().await.map_err(text)?;
            if f.kind != wire::FRAME_BODY {
                return Err(format!("expected a body frame, got frame type {}", f.kind));
            }
            body.extend_from_slice(&f.payload);
        }
        Ok(Some(Delivery {
            exchange,
            routing_key,
            properties,
            body,
        }))
    }
}
