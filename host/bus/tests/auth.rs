//! Authentication the servers must be set up for, against servers set up
//! for it: RabbitMQ taking only client-certificate (EXTERNAL) logins, and
//! nats-server in operator mode (JWTs, creds files). This binary's RabbitMQ
//! is its own (EXTERNAL is its only login mechanism).
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use wasmwatch_bus::Buses;
use wasmwatch_bus::testing::AmqpTestClient;
use wasmwatch_core::manifest::{AmqpSpec, BusConnection, NatsSpec, TlsFiles};
use wasmwatch_testkit::brokers::{
    ClientCert, Nats, Rabbit, certificates_with_clients, free_port, rabbit_with_external_auth,
};
use wasmwatch_testkit::nats_jwt;

fn tempdir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "wasmwatch-auth-{what}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

// ---------------------------------------------------------------- RabbitMQ

/// Files of a client certificate.
struct Client {
    cert: PathBuf,
    key: PathBuf,
}

/// The broker, its CA and client certificates.
struct Pki {
    rabbit: &'static Rabbit,
    ca: PathBuf,
    /// CN `wasmwatch`, a user of the broker.
    wasmwatch: Client,
    /// CN `stranger`, signed by the broker's CA but no user of the broker.
    stranger: Client,
    /// CN `wasmwatch`, signed by another CA.
    outsider: Client,
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempdir("pki");
        let (tls, clients) = certificates_with_clients(&["wasmwatch", "stranger"]);
        let (_, others) = certificates_with_clients(&["wasmwatch"]);
        let ca = write(&dir, "ca.pem", &tls.ca_pem);
        let client = |name: &str, c: &ClientCert| Client {
            cert: write(&dir, &format!("{name}.pem"), &c.cert_pem),
            key: write(&dir, &format!("{name}.key"), &c.key_pem),
        };
        let rabbit = rabbit_with_external_auth(|| tls);
        rabbit.add_certificate_user("wasmwatch").unwrap();
        Pki {
            rabbit,
            ca,
            wasmwatch: client("wasmwatch", &clients[0]),
            stranger: client("stranger", &clients[1]),
            outsider: client("outsider", &others[0]),
        }
    })
}

/// An amqps bus as a manifest writes it: the URL asks for EXTERNAL, the
/// `tls` block names the CA and the client certificate.
fn external_bus(name: &str, url: &str, ca: &Path, client: Option<&Client>) -> BusConnection {
    BusConnection {
        name: name.into(),
        amqp: Some(AmqpSpec {
            url: url.into(),
            tls: Some(TlsFiles {
                ca_file: Some(ca.into()),
                cert_file: client.map(|c| c.cert.clone()),
                key_file: client.map(|c| c.key.clone()),
            }),
            ..Default::default()
        }),
        nats: None,
    }
}

fn external_url(r: &Rabbit) -> String {
    format!(
        "amqps://localhost:{}/?auth_mechanism=external",
        r.tls_port()
    )
}

/// A consumer logged in with the client certificate too, its files named
/// in the URL's query this time.
async fn consumer(p: &Pki) -> AmqpTestClient {
    let url = format!(
        "{}&cacertfile={}&certfile={}&keyfile={}",
        external_url(p.rabbit),
        p.ca.display(),
        p.wasmwatch.cert.display(),
        p.wasmwatch.key.display()
    );
    AmqpTestClient::connect(&url).await.unwrap()
}

#[tokio::test]
async fn amqp_external_login_with_a_client_certificate() {
    let p = pki();
    let url = external_url(p.rabbit);
    let buses = Buses::new(&[external_bus("cert", &url, &p.ca, Some(&p.wasmwatch))]).unwrap();
    let mut c = consumer(p).await;
    c.declare_exchange("ext-x", "topic").await.unwrap();
    c.queue_bound("ext-q", "ext-x", "#").await.unwrap();
    buses
        .publish("cert", "ext-x", "k", &[], b"{\"external\":true}")
        .await
        .unwrap();
    let d = c.get("ext-q").await.unwrap().expect("the message arrived");
    assert_eq!(d.body, b"{\"external\":true}");
    // The connection is reused.
    buses
        .publish("cert", "ext-x", "k", &[], b"2")
        .await
        .unwrap();
    assert_eq!(c.get("ext-q").await.unwrap().unwrap().body, b"2");
}

/// Refusals are permanent (a retry cannot change them), name the bus and
/// the address, and say what is missing.
#[tokio::test]
async fn amqp_external_refusals_name_the_bus_and_address() {
    let p = pki();
    let port = p.rabbit.tls_port();
    let url = external_url(p.rabbit);
    let address = format!("amqps://localhost:{port}/%2F");

    // EXTERNAL without a client certificate cannot work: a start-up error.
    let e = Buses::new(&[external_bus("nocert", &url, &p.ca, None)]).unwrap_err();
    assert_eq!(e.connection, "nocert");
    assert!(e.problem.contains("needs a client certificate"), "{e}");

    let plain = format!("amqps://guest:guest@localhost:{port}/");
    let buses = Buses::new(&[
        external_bus("nocert", &plain, &p.ca, None),
        external_bus("stranger", &url, &p.ca, Some(&p.stranger)),
        external_bus("outsider", &url, &p.ca, Some(&p.outsider)),
        external_bus("plain", &plain, &p.ca, Some(&p.wasmwatch)),
    ])
    .unwrap();
    let refusal = |name: &'static str| {
        let buses = &buses;
        async move {
            let e = buses
                .publish(name, "ext-x", "k", &[], b"{}")
                .await
                .unwrap_err();
            let text = e.to_string();
            assert!(text.contains(&format!("bus connection {name:?}")), "{text}");
            (e.retryable(), text)
        }
    };

    // The broker refuses a client certificate with a TLS alert and closes;
    // the client reads the alert (a permanent refusal, explained) unless
    // the close overtakes it (a reset, retryable: the next attempt meets
    // the same refusal). Either way nothing connects and the error names
    // the bus and address.
    let reset = |text: &str| text.contains("Connection reset by peer");

    // No client certificate: the TLS handshake is refused.
    let (retryable, text) = refusal("nocert").await;
    let guest_address = format!("amqps://guest@localhost:{port}/%2F");
    assert!(text.contains(&guest_address), "{text}");
    assert!(
        reset(&text)
            || (!retryable
                && text.contains("refused the TLS connection")
                && text.contains("requires a client certificate")),
        "{text}"
    );

    // A certificate from the right CA, but no such user.
    let (retryable, text) = refusal("stranger").await;
    assert!(!retryable, "{text}");
    assert!(text.contains(&address), "{text}");
    assert!(
        text.contains("403 ACCESS_REFUSED") && text.contains("EXTERNAL"),
        "{text}"
    );
    assert!(text.contains("client certificate's subject"), "{text}");

    // A certificate the broker's CA did not sign.
    let (retryable, text) = refusal("outsider").await;
    assert!(text.contains(&address), "{text}");
    assert!(
        reset(&text) || (!retryable && text.contains("not signed by a CA it trusts")),
        "{text}"
    );

    // PLAIN, which this broker does not offer: it hangs up.
    let (_, text) = refusal("plain").await;
    assert!(text.contains(&guest_address), "{text}");
    assert!(text.contains("does not offer PLAIN"), "{text}");
    assert!(!text.contains("guest:guest"), "{text}");
}

// ---------------------------------------------------------------- NATS

fn creds_bus(name: &str, url: &str, creds: &Path) -> BusConnection {
    BusConnection {
        name: name.into(),
        amqp: None,
        nats: Some(NatsSpec {
            url: url.into(),
            creds_file: Some(creds.into()),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn nats_creds_file_in_operator_mode() {
    let dir = tempdir("nats");
    let op = nats_jwt::Operator::new();
    let conf = write(&dir, "server.conf", &op.server_config());
    let server = Nats::start(&["-c", conf.to_str().unwrap()]);
    let creds = write(&dir, "app.creds", &op.creds());

    // A user of an account the server does not know.
    let (stranger_account, stranger) = (nkeys::KeyPair::new_account(), nkeys::KeyPair::new_user());
    let stranger_jwt = nats_jwt::user_jwt(&stranger_account, &stranger, "stranger");
    let unknown = write(
        &dir,
        "unknown.creds",
        &nats_jwt::creds(&stranger_jwt, &stranger),
    );

    let buses = Buses::new(&[
        creds_bus("creds", &server.url(), &creds),
        creds_bus("unknown", &server.url(), &unknown),
    ])
    .unwrap();
    let sub = async_nats::ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap()
        .connect(server.url())
        .await
        .unwrap();
    let mut s = sub.subscribe("config.refresh").await.unwrap();
    sub.flush().await.unwrap();
    buses
        .publish("creds", "config.refresh", "", &[], b"{\"creds\":true}")
        .await
        .unwrap();
    use futures_util::StreamExt;
    let m = tokio::time::timeout(std::time::Duration::from_secs(5), s.next())
        .await
        .expect("no message within 5 s")
        .unwrap();
    assert_eq!(m.payload.as_ref(), b"{\"creds\":true}");

    // Refused at once, permanently, naming the bus and the address.
    let e = buses
        .publish("unknown", "config.refresh", "", &[], b"{}")
        .await
        .unwrap_err();
    assert!(!e.retryable(), "{e}");
    let text = e.to_string();
    let address = format!("bus connection \"unknown\" ({})", server.url());
    assert!(text.contains(&address), "{text}");
    assert!(
        text.contains("Authorization Violation") && text.contains("credsFile"),
        "{text}"
    );
    // Nothing of the creds file's secrets shows.
    assert!(!text.contains(&stranger.seed().unwrap()), "{text}");
    assert!(!text.contains(&stranger_jwt), "{text}");
    // The creds bus still works.
    buses
        .publish("creds", "config.refresh", "", &[], b"2")
        .await
        .unwrap();
    let m = tokio::time::timeout(std::time::Duration::from_secs(5), s.next())
        .await
        .expect("no message within 5 s")
        .unwrap();
    assert_eq!(m.payload.as_ref(), b"2");
}
