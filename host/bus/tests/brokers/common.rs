//! Bus connections and headers for the tests, this binary's RabbitMQ (the
//! shared one from `wasmwatch_testkit::brokers`, with TLS), and a TCP proxy
//! that can cut connections.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::AbortHandle;
use wasmwatch_core::action::Header;
use wasmwatch_core::manifest::{AmqpSpec, BusConnection, NatsSpec};
use wasmwatch_testkit::brokers::{Rabbit, Tls, free_port, rabbit_with_tls};

pub fn amqp_bus(name: &str, url: &str) -> BusConnection {
    BusConnection {
        name: name.into(),
        amqp: Some(AmqpSpec {
            url: url.into(),
            ..Default::default()
        }),
        nats: None,
    }
}

pub fn nats_bus(name: &str, url: &str) -> BusConnection {
    BusConnection {
        name: name.into(),
        amqp: None,
        nats: Some(NatsSpec {
            url: url.into(),
            ..Default::default()
        }),
    }
}

pub fn header(name: &str, value: &str) -> Header {
    Header {
        name: name.into(),
        value: value.into(),
    }
}

// ---------------------------------------------------------------- RabbitMQ

/// The RabbitMQ of this test binary, with an amqps listener; started on
/// first use.
pub fn rabbit() -> &'static Rabbit {
    rabbit_with_tls(certificates)
}

/// A CA and a server certificate for `localhost` signed by it.
pub fn certificates() -> Tls {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "wasmwatch test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &ca).unwrap();
    Tls {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

// ---------------------------------------------------------------- proxy

/// A TCP proxy to a local port whose connections can be cut and whose
/// listener can be closed and reopened on the same port.
pub struct Proxy {
    pub port: u16,
    upstream: u16,
    accepted: Arc<AtomicUsize>,
    listener: Mutex<Option<AbortHandle>>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        let p = Proxy {
            port: free_port(),
            upstream,
            accepted: Arc::default(),
            listener: Mutex::default(),
            conns: Arc::default(),
        };
        p.resume().await;
        p
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Listens (again) on the proxy's port.
    pub async fn resume(&self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .unwrap();
        let (upstream, accepted, conns) =
            (self.upstream, self.accepted.clone(), self.conns.clone());
        let handle = tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let h = tokio::spawn(async move {
                    if let Ok(mut up) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                conns.lock().unwrap().push(h.abort_handle());
            }
        });
        *self.listener.lock().unwrap() = Some(handle.abort_handle());
    }

    /// Drops every connection (both sides see them closed); keeps listening.
    pub async fn cut(&self) {
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
        // Give the runtime a moment to drop the aborted tasks' sockets.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Drops every connection and stops listening (connections are refused).
    pub async fn stop(&self) {
        if let Some(l) = self.listener.lock().unwrap().take() {
            l.abort();
        }
        self.cut().await;
    }
}
