//! Publishing to RabbitMQ.
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_bus::testing::{AmqpTestClient, FieldValue};
use wasmwatch_bus::{Buses, PublishError};
use wasmwatch_testkit::brokers::free_port;

use crate::common::{Proxy, amqp_bus, header, rabbit};

async fn consumer() -> AmqpTestClient {
    AmqpTestClient::connect(&rabbit().url()).await.unwrap()
}

fn text(v: &str) -> FieldValue {
    FieldValue::Str(v.into())
}

#[tokio::test]
async fn publish_to_spring_cloud_bus_reaches_a_queue_bound_with_hash() {
    let r = rabbit();
    let buses = Buses::new(&[amqp_bus("spring-bus", &r.url())]).unwrap();
    let mut c = consumer().await;

    // Before any consumer: the exchange gets declared; the message reaches
    // nobody, which is not an error (it is logged).
    buses
        .publish("spring-bus", "springCloudBus", "orders:**", &[], b"{}")
        .await
        .unwrap();
    assert!(
        c.exchange_is("springCloudBus", "topic", true)
            .await
            .unwrap(),
        "springCloudBus should be a durable topic exchange"
    );

    c.queue_bound("spring-q", "springCloudBus", "#")
        .await
        .unwrap();
    let payload = br#"{"type":"RefreshRemoteApplicationEvent","originService":"wasmwatch","destinationService":"orders:**","id":"7d0c"}"#;
    let headers = [
        header("contentType", "application/json"),
        header("x-wasmwatch-id", "7d0c"),
    ];
    buses
        .publish(
            "spring-bus",
            "springCloudBus",
            "orders:**",
            &headers,
            payload,
        )
        .await
        .unwrap();

    let d = c
        .get("spring-q")
        .await
        .unwrap()
        .expect("a message in the queue");
    assert_eq!(d.body, payload);
    assert_eq!(d.exchange, "springCloudBus");
    assert_eq!(d.routing_key, "orders:**");
    assert_eq!(
        d.properties.content_type.as_deref(),
        Some("application/json")
    );
    assert_eq!(d.properties.delivery_mode, Some(2), "persistent");
    assert_eq!(
        d.properties.headers,
        Some(vec![
            ("contentType".to_string(), text("application/json")),
            ("x-wasmwatch-id".to_string(), text("7d0c")),
        ])
    );
    assert_eq!(
        c.get("spring-q").await.unwrap(),
        None,
        "exactly one message"
    );
}

#[tokio::test]
async fn an_existing_exchange_of_another_type_and_the_default_exchange_are_used() {
    let r = rabbit();
    let buses = Buses::new(&[amqp_bus("bus", &r.url())]).unwrap();
    let mut c = consumer().await;
    c.declare_exchange("legacy-fanout", "fanout").await.unwrap();
    c.queue_bound("fanout-q", "legacy-fanout", "")
        .await
        .unwrap();

    buses
        .publish("bus", "legacy-fanout", "any", &[], b"[1]")
        .await
        .unwrap();
    assert_eq!(c.get("fanout-q").await.unwrap().unwrap().body, b"[1]");
    assert!(
        c.exchange_is("legacy-fanout", "fanout", false)
            .await
            .unwrap()
    );

    // The default exchange routes by queue name.
    buses
        .publish("bus", "", "fanout-q", &[], b"[2]")
        .await
        .unwrap();
    assert_eq!(c.get("fanout-q").await.unwrap().unwrap().body, b"[2]");

    // amq.* is never declared: a missing one is the broker's 404, which
    // closes the channel; the next publish gets a fresh connection.
    let e = buses
        .publish("bus", "amq.missing", "k", &[], b"{}")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    assert!(e.to_string().contains("404 NOT_FOUND"), "{e}");
    buses
        .publish("bus", "", "fanout-q", &[], b"[3]")
        .await
        .unwrap();
    assert_eq!(c.get("fanout-q").await.unwrap().unwrap().body, b"[3]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_and_large_payloads_all_arrive() {
    let r = rabbit();
    let buses = Arc::new(Buses::new(&[amqp_bus("bus", &r.url())]).unwrap());
    let mut c = consumer().await;
    c.declare_exchange("concurrent-x", "topic").await.unwrap();
    c.queue_bound("concurrent-q", "concurrent-x", "#")
        .await
        .unwrap();

    // Every 8th payload spans several frames (frame_max is 128 KiB).
    let payload = |i: usize| {
        let n = if i.is_multiple_of(8) {
            300_000 + i
        } else {
            10 + i
        };
        (0..n).map(|k| (k * 31 + i) as u8).collect::<Vec<u8>>()
    };
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let buses = buses.clone();
            tokio::spawn(async move {
                buses
                    .publish("bus", "concurrent-x", &format!("k.{i}"), &[], &payload(i))
                    .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let mut got = Vec::new();
    while let Some(d) = c.get("concurrent-q").await.unwrap() {
        let i: usize = d.routing_key[2..].parse().unwrap();
        assert_eq!(d.body, payload(i), "payload of message {i}");
        got.push(i);
    }
    got.sort();
    assert_eq!(got, (0..32).collect::<Vec<_>>());
}

#[tokio::test]
async fn unknown_connection_is_permanent_and_named() {
    let buses = Buses::new(&[amqp_bus("spring-bus", "amqp://127.0.0.1:1/")]).unwrap();
    let e = buses
        .publish("sprng-bus", "springCloudBus", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(matches!(e, PublishError::UnknownConnection { .. }));
    assert!(!e.retryable());
    let msg = e.to_string();
    assert!(
        msg.contains("\"sprng-bus\"") && msg.contains("spring-bus"),
        "{msg}"
    );
}

#[tokio::test]
async fn broker_down_is_retryable_at_once_and_names_connection_and_address() {
    let port = free_port();
    let buses = Buses::new(&[amqp_bus(
        "spring-bus",
        &format!("amqp://u:s3cret@127.0.0.1:{port}/"),
    )])
    .unwrap();
    let t = Instant::now();
    let e = buses
        .publish("spring-bus", "springCloudBus", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(e.retryable(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("\"spring-bus\""), "{msg}");
    assert!(
        msg.contains(&format!("amqp://u@127.0.0.1:{port}/%2F")),
        "{msg}"
    );
    assert!(!msg.contains("s3cret"), "{msg}");
}

#[tokio::test]
async fn a_silent_broker_times_out_as_retryable() {
    // Accepts connections and never says anything.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let buses = Buses::new(&[amqp_bus("bus", &format!("amqp://127.0.0.1:{port}"))])
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let t = Instant::now();
    let e = buses.publish("bus", "x", "", &[], b"{}").await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(e.retryable(), "{e}");
    assert!(
        e.to_string().contains("no answer within 300ms connecting"),
        "{e}"
    );
}

#[tokio::test]
async fn wrong_password_and_unknown_vhost_are_permanent() {
    let r = rabbit();
    let buses = Buses::new(&[
        amqp_bus(
            "badpass",
            &format!("amqp://guest:n0pe@127.0.0.1:{}/", r.port),
        ),
        amqp_bus(
            "badvhost",
            &format!("amqp://guest:guest@127.0.0.1:{}/nowhere", r.port),
        ),
    ])
    .unwrap();
    let e = buses
        .publish("badpass", "x", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("403 ACCESS_REFUSED") && !msg.contains("n0pe"),
        "{msg}"
    );
    let e = buses
        .publish("badvhost", "x", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    assert!(e.to_string().contains("530 NOT_ALLOWED"), "{e}");
}

#[tokio::test]
async fn reconnects_after_the_connection_is_cut_and_after_an_outage() {
    let r = rabbit();
    let proxy = Proxy::start(r.port).await;
    let buses = Buses::new(&[amqp_bus(
        "bus",
        &format!("amqp://127.0.0.1:{}/", proxy.port),
    )])
    .unwrap()
    .with_timeout(Duration::from_secs(2));
    let mut c = consumer().await;
    c.declare_exchange("reconnect-x", "topic").await.unwrap();
    c.queue_bound("reconnect-q", "reconnect-x", "#")
        .await
        .unwrap();
    let publish = |body: &'static [u8]| buses.publish("bus", "reconnect-x", "k", &[], body);

    publish(b"1").await.unwrap();
    assert_eq!(proxy.accepted(), 1);
    publish(b"2").await.unwrap();
    assert_eq!(proxy.accepted(), 1, "the connection is reused");

    // The network drops the idle connection: the next publish notices and
    // reconnects within the same call.
    proxy.cut().await;
    publish(b"3").await.unwrap();
    assert_eq!(proxy.accepted(), 2);

    // The broker is unreachable: retryable errors, then success once back.
    proxy.stop().await;
    let e = publish(b"lost").await.unwrap_err();
    assert!(e.retryable(), "{e}");
    proxy.resume().await;
    publish(b"4").await.unwrap();

    let mut bodies = Vec::new();
    while let Some(d) = c.get("reconnect-q").await.unwrap() {
        bodies.push(String::from_utf8(d.body).unwrap());
    }
    assert_eq!(bodies, ["1", "2", "3", "4"]);
}

#[tokio::test]
async fn amqps_verifies_the_broker_certificate() {
    let r = rabbit();
    let buses = Buses::new(&[
        amqp_bus("tls", &r.tls_url(Some(r.ca_file()))),
        amqp_bus("untrusted", &r.tls_url(None)),
    ])
    .unwrap();
    let mut c = consumer().await;
    c.declare_exchange("tls-x", "topic").await.unwrap();
    c.queue_bound("tls-q", "tls-x", "#").await.unwrap();
    buses
        .publish("tls", "tls-x", "k", &[], b"{\"tls\":true}")
        .await
        .unwrap();
    assert_eq!(
        c.get("tls-q").await.unwrap().unwrap().body,
        b"{\"tls\":true}"
    );

    // Against the system's CAs the test CA is unknown.
    let e = buses
        .publish("untrusted", "tls-x", "k", &[], b"{}")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}
