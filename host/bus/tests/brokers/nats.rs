//! Publishing to a NATS server.
use std::time::{Duration, Instant};

use wasmwatch_bus::Buses;
use wasmwatch_testkit::brokers::{Nats, NatsMsg, NatsSub, free_port};

use crate::common::{header, nats_bus};

#[tokio::test]
async fn pub_reaches_a_subscriber_with_the_exact_payload() {
    let server = Nats::start(&[]);
    let mut sub = NatsSub::subscribe(server.port, "config.changed").await;
    let buses = Buses::new(&[nats_bus("events", &server.url())]).unwrap();
    // Line breaks and non-UTF-8 bytes travel unchanged.
    let payload = b"{\"a\":1}\r\nPUB x 1\r\n\xff\x00".to_vec();
    buses
        .publish(
            "events",
            "config.changed",
            "ignored.when.destination.set",
            &[],
            &payload,
        )
        .await
        .unwrap();
    assert_eq!(
        sub.next().await,
        NatsMsg {
            subject: "config.changed".into(),
            headers: None,
            payload,
        }
    );
}

#[tokio::test]
async fn hpub_headers_arrive_and_routing_key_is_the_fallback_subject() {
    let server = Nats::start(&[]);
    let mut sub = NatsSub::subscribe(server.port, "orders.refresh").await;
    let buses = Buses::new(&[nats_bus("events", &server.url())]).unwrap();
    let headers = [
        header("Content-Type", "application/json"),
        header("X-Wasmwatch-Id", "7d0c: x"),
    ];
    buses
        .publish("events", "", "orders.refresh", &headers, b"{}")
        .await
        .unwrap();
    assert_eq!(
        sub.next().await,
        NatsMsg {
            subject: "orders.refresh".into(),
            headers: Some(
                "NATS/1.0\r\nContent-Type: application/json\r\nX-Wasmwatch-Id: 7d0c: x\r\n\r\n"
                    .into()
            ),
            payload: b"{}".to_vec(),
        }
    );

    let e = buses
        .publish("events", "", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    let e = buses
        .publish("events", "a b", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(
        !e.retryable() && e.to_string().contains("\"events\""),
        "{e}"
    );
}

#[tokio::test]
async fn reconnects_after_a_server_restart() {
    let mut server = Nats::start(&[]);
    let buses = Buses::new(&[nats_bus("events", &server.url())])
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    buses.publish("events", "s", "", &[], b"1").await.unwrap();

    // Restarted while idle: the next publish reconnects by itself.
    server.restart();
    let mut sub = NatsSub::subscribe(server.port, "s").await;
    buses.publish("events", "s", "", &[], b"2").await.unwrap();
    assert_eq!(sub.next().await.payload, b"2");

    // Down: retryable, fast. Back: works again.
    server.stop();
    let t = Instant::now();
    let e = buses
        .publish("events", "s", "", &[], b"lost")
        .await
        .unwrap_err();
    assert!(e.retryable(), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let msg = e.to_string();
    assert!(
        msg.contains("\"events\"") && msg.contains(&server.url()),
        "{msg}"
    );
    server.restart();
    let mut sub = NatsSub::subscribe(server.port, "s").await;
    buses.publish("events", "s", "", &[], b"3").await.unwrap();
    assert_eq!(sub.next().await.payload, b"3");
}

#[tokio::test]
async fn server_down_is_retryable() {
    let port = free_port();
    let buses = Buses::new(&[nats_bus("events", &format!("nats://127.0.0.1:{port}"))]).unwrap();
    let e = buses
        .publish("events", "s", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(e.retryable(), "{e}");
    assert!(e.to_string().contains("cannot connect"), "{e}");
}

#[tokio::test]
async fn token_authentication_and_its_refusal() {
    let server = Nats::start(&["--auth", "s3cret"]);
    let good = format!("nats://s3cret@127.0.0.1:{}", server.port);
    let bad = format!("nats://wr0ng@127.0.0.1:{}", server.port);
    let buses = Buses::new(&[nats_bus("good", &good), nats_bus("bad", &bad)]).unwrap();
    buses.publish("good", "s", "", &[], b"{}").await.unwrap();
    let e = buses.publish("bad", "s", "", &[], b"{}").await.unwrap_err();
    assert!(!e.retryable(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("Authorization Violation") && !msg.contains("wr0ng"),
        "{msg}"
    );
}

/// A connection that dies while a publish is on it (closed by the peer only
/// once the message was written, so it cannot be noticed before) is replaced
/// once within the same publish. No real server can be made to fail at that
/// moment, so this peer is scripted: the first connection accepts one
/// message and closes on the second; later connections accept everything.
#[tokio::test]
async fn a_connection_that_dies_during_a_publish_is_replaced_once() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = tokio::spawn(async move {
        let mut received = Vec::new();
        for conn in 0..2 {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            s.get_mut()
                .write_all(b"INFO {\"headers\":true,\"max_payload\":1048576}\r\n")
                .await
                .unwrap();
            let mut pubs = 0;
            let mut line = String::new();
            loop {
                line.clear();
                if s.read_line(&mut line).await.unwrap() == 0 {
                    break;
                }
                if line.starts_with("PUB ") {
                    pubs += 1;
                    if conn == 0 && pubs == 2 {
                        break; // dies with the message unanswered
                    }
                    line.clear();
                    s.read_line(&mut line).await.unwrap();
                    received.push(line.trim_end().to_string());
                } else if line.starts_with("PING") {
                    s.get_mut().write_all(b"PONG\r\n").await.unwrap();
                    if received.len() == 2 {
                        return received;
                    }
                }
            }
        }
        received
    });
    let buses = Buses::new(&[nats_bus("events", &format!("nats://127.0.0.1:{port}"))])
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    buses
        .publish("events", "s", "", &[], b"first")
        .await
        .unwrap();
    buses
        .publish("events", "s", "", &[], b"second")
        .await
        .unwrap();
    assert_eq!(peer.await.unwrap(), ["first", "second"]);
}
