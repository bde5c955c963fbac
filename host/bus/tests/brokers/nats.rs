//! Publishing to a NATS server.
use std::time::{Duration, Instant};

use wasmwatch_bus::Buses;
use wasmwatch_core::manifest::{NatsSpec, TlsFiles};
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
    let m = sub.next().await;
    assert_eq!(
        (m.subject.as_str(), m.payload.as_slice()),
        ("orders.refresh", b"{}".as_slice())
    );
    // async-nats keeps headers in a map: the order of names may change.
    let block = m.headers.expect("HMSG");
    assert!(
        block.starts_with("NATS/1.0\r\n") && block.ends_with("\r\n\r\n"),
        "{block:?}"
    );
    let mut lines: Vec<&str> = block.trim_end().lines().skip(1).collect();
    lines.sort();
    assert_eq!(
        lines,
        ["Content-Type: application/json", "X-Wasmwatch-Id: 7d0c: x"]
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

/// Secrets from files (a mounted Secret), the address never shows them.
#[tokio::test]
async fn user_and_password_from_a_file_and_nkey_authentication() {
    let dir = tempdir();
    let nkey = nkeys::KeyPair::new_user();
    let conf = dir.join("server.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{user: app, password: s3cret}}, {{nkey: {}}} ] }}\n",
            nkey.public_key()
        ),
    )
    .unwrap();
    let server = Nats::start(&["-c", conf.to_str().unwrap()]);
    let password = dir.join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let seed = dir.join("nkey.seed");
    std::fs::write(&seed, nkey.seed().unwrap()).unwrap();
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "nope").unwrap();
    let url = format!("nats://app@127.0.0.1:{}", server.port);
    let plain = format!("nats://127.0.0.1:{}", server.port);
    let buses = Buses::new(&[
        nats_spec(
            "file",
            NatsSpec {
                url: url.clone(),
                password_file: Some(password),
                ..Default::default()
            },
        ),
        nats_spec(
            "nkey",
            NatsSpec {
                url: plain.clone(),
                nkey_file: Some(seed),
                ..Default::default()
            },
        ),
        nats_spec(
            "wrong",
            NatsSpec {
                url,
                password_file: Some(wrong),
                ..Default::default()
            },
        ),
    ])
    .unwrap();
    let mut sub = NatsSub::subscribe_as(server.port, "s", "app", "s3cret").await;
    buses.publish("file", "s", "", &[], b"1").await.unwrap();
    buses.publish("nkey", "s", "", &[], b"2").await.unwrap();
    assert_eq!(sub.next().await.payload, b"1");
    assert_eq!(sub.next().await.payload, b"2");
    let e = buses
        .publish("wrong", "s", "", &[], b"3")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    let msg = e.to_string().to_lowercase();
    assert!(
        msg.contains("authorization violation") && !msg.contains("nope"),
        "{msg}"
    );

    // Two ways at once, or a file that is not a seed: refused at start-up.
    let e = Buses::new(&[nats_spec(
        "both",
        NatsSpec {
            url: format!("nats://tok@127.0.0.1:{}", server.port),
            nkey_file: Some(dir.join("nkey.seed")),
            ..Default::default()
        },
    )])
    .unwrap_err();
    assert!(e.to_string().contains("more than one way"), "{e}");
    let e = Buses::new(&[nats_spec(
        "bad",
        NatsSpec {
            url: plain,
            nkey_file: Some(dir.join("password")),
            ..Default::default()
        },
    )])
    .unwrap_err();
    assert!(e.to_string().contains("NKey user seed"), "{e}");
}

/// TLS: required by the server, verified against our CA; without the CA
/// the certificate is refused (retryable: fixing the trust can make it pass).
#[tokio::test]
async fn tls_is_verified_against_the_given_ca() {
    let dir = tempdir();
    let certs = crate::common::certificates();
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca, &certs.ca_pem).unwrap();
    std::fs::write(&cert, &certs.cert_pem).unwrap();
    std::fs::write(&key, &certs.key_pem).unwrap();
    let server = Nats::start(&[
        "--tls",
        "--tlscert",
        cert.to_str().unwrap(),
        "--tlskey",
        key.to_str().unwrap(),
    ]);
    let url = format!("tls://localhost:{}", server.port);
    let tls = TlsFiles {
        ca_file: Some(ca),
        ..Default::default()
    };
    let buses = Buses::new(&[
        nats_spec(
            "tls",
            NatsSpec {
                url: url.clone(),
                tls: Some(tls),
                ..Default::default()
            },
        ),
        nats_spec(
            "untrusted",
            NatsSpec {
                url,
                ..Default::default()
            },
        ),
    ])
    .unwrap();
    buses.publish("tls", "s", "", &[], b"{}").await.unwrap();
    let e = buses
        .publish("untrusted", "s", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
}

fn nats_spec(name: &str, spec: NatsSpec) -> wasmwatch_core::manifest::BusConnection {
    wasmwatch_core::manifest::BusConnection {
        name: name.into(),
        amqp: None,
        nats: Some(spec),
    }
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "wasmwatch-nats-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
