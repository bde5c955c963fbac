//! For this crate's tests only (not a stable API): an AMQP client on lapin
//! that declares exchanges and queues and fetches messages with `basic.get`.
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

/// A header value as the broker delivered it.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Str(String),
    Other(String),
}

/// The properties the tests look at.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    /// Sorted by name.
    pub headers: Option<Vec<(String, FieldValue)>>,
}

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
    conn: Connection,
    channel: Channel,
}

fn text(e: lapin::Error) -> String {
    e.to_string()
}

fn kind(k: &str) -> ExchangeKind {
    match k {
        "topic" => ExchangeKind::Topic,
        "fanout" => ExchangeKind::Fanout,
        "direct" => ExchangeKind::Direct,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.into()),
    }
}

impl AmqpTestClient {
    pub async fn connect(url: &str) -> Result<AmqpTestClient, String> {
        let spec = wasmwatch_core::manifest::AmqpSpec {
            url: url.into(),
            ..Default::default()
        };
        let conn = crate::amqp::Target::parse(&spec, "test")?
            .connect()
            .await
            .map_err(|p| p.to_string())?;
        let channel = conn.create_channel().await.map_err(text)?;
        Ok(AmqpTestClient { conn, channel })
    }

    async fn reopen(&mut self) -> Result<(), String> {
        self.channel = self.conn.create_channel().await.map_err(text)?;
        Ok(())
    }

    /// Declares a non-durable exchange of the given type.
    pub async fn declare_exchange(&mut self, name: &str, k: &str) -> Result<(), String> {
        self.channel
            .exchange_declare(
                ShortString::from(name),
                kind(k),
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(text)
    }

    /// Whether the exchange exists and, if so, is durable with this type:
    /// a passive declare, then an equivalent active one (which fails with
    /// 406 if the type or durability differ).
    pub async fn exchange_is(
        &mut self,
        name: &str,
        k: &str,
        durable: bool,
    ) -> Result<bool, String> {
        for options in [
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            ExchangeDeclareOptions {
                durable,
                ..Default::default()
            },
        ] {
            let r = self
                .channel
                .exchange_declare(
                    ShortString::from(name),
                    kind(k),
                    options,
                    FieldTable::default(),
                )
                .await;
            if let Err(e) = r {
                if self.channel.status().connected() {
                    return Err(text(e));
                }
                self.reopen().await?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub async fn delete_exchange(&mut self, name: &str) -> Result<(), String> {
        self.channel
            .exchange_delete(ShortString::from(name), ExchangeDeleteOptions::default())
            .await
            .map_err(text)
    }

    /// Declares an exclusive, auto-deleted queue and binds it.
    pub async fn queue_bound(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> Result<(), String> {
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        };
        self.declare_and_bind(queue, options, exchange, key).await
    }

    /// Declares a durable queue (it survives a broker restart) and binds it.
    pub async fn durable_queue_bound(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> Result<(), String> {
        let options = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        self.declare_and_bind(queue, options, exchange, key).await
    }

    async fn declare_and_bind(
        &mut self,
        queue: &str,
        options: QueueDeclareOptions,
        exchange: &str,
        key: &str,
    ) -> Result<(), String> {
        self.channel
            .queue_declare(ShortString::from(queue), options, FieldTable::default())
            .await
            .map_err(text)?;
        self.channel
            .queue_bind(
                ShortString::from(queue),
                ShortString::from(exchange),
                ShortString::from(key),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(text)
    }

    /// Takes the next message off the queue (auto-ack), if there is one.
    pub async fn get(&mut self, queue: &str) -> Result<Option<Delivery>, String> {
        let got = self
            .channel
            .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
            .await
            .map_err(text)?;
        Ok(got.map(|m| {
            let d = m.delivery;
            let p = &d.properties;
            let headers = p.headers().as_ref().map(|t| {
                t.inner()
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            AMQPValue::LongString(s) => FieldValue::Str(s.to_string()),
                            AMQPValue::ShortString(s) => FieldValue::Str(s.to_string()),
                            other => FieldValue::Other(format!("{other:?}")),
                        };
                        (k.to_string(), v)
                    })
                    .collect()
            });
            Delivery {
                exchange: d.exchange.to_string(),
                routing_key: d.routing_key.to_string(),
                properties: Properties {
                    content_type: p.content_type().as_ref().map(|s| s.to_string()),
                    delivery_mode: *p.delivery_mode(),
                    headers,
                },
                body: d.data,
            }
        }))
    }
}
