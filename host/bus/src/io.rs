//! The byte stream under both protocols: TCP, optionally TLS (rustls, ring),
//! with a read buffer that the protocol codecs parse from.
use std::future::poll_fn;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tracing::{debug, warn};

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// How to wrap a connection in TLS.
#[derive(Clone)]
pub(crate) struct Tls {
    config: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// Verifies servers against `ca_file` (PEM) when given, else against the
    /// system's trust store.
    pub(crate) fn new(ca_file: Option<&Path>) -> Result<Tls, String> {
        let mut roots = rustls::RootCertStore::empty();
        match ca_file {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| {
                        format!("cannot read CA certificates from {}: {e}", path.display())
                    })?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("no CA certificate found in {}", path.display()));
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    warn!(error = %e, "loading the system's CA certificates");
                }
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    warn!(
                        "no system CA certificates found: amqps connections will fail verification"
                    );
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls {
            config: Arc::new(config),
        })
    }
}

/// One connection and the bytes read from it but not parsed yet.
pub(crate) struct Conn {
    stream: Box<dyn Stream>,
    /// Unparsed input; the codecs consume from the front.
    pub(crate) rbuf: Vec<u8>,
}

impl Conn {
    /// Connects to `host:port` (resolving names, trying every address),
    /// then does the TLS handshake when `tls` is given (the certificate must
    /// name `host`). No timeout here: callers bound the whole set-up.
    pub(crate) async fn connect(host: &str, port: u16, tls: Option<&Tls>) -> io::Result<Conn> {
        let tcp = TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        debug!(host, port, tls = tls.is_some(), "TCP connected");
        let stream: Box<dyn Stream> = match tls {
            None => Box::new(tcp),
            Some(tls) => {
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                Box::new(connector.connect(name, tcp).await?)
            }
        };
        Ok(Conn {
            stream,
            rbuf: Vec::with_capacity(8192),
        })
    }

    /// Reads at least one more byte into `rbuf`; end of stream is an error.
    pub(crate) async fn fill(&mut self) -> io::Result<()> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(8192);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            return Err(closed());
        }
        Ok(())
    }

    /// Reads what has already arrived, without waiting: `Ok(true)` if
    /// something was read, `Ok(false)` if nothing is there; end of stream is
    /// an error. Used to notice, before reusing an idle connection, that the
    /// peer closed it or sent something that needs an answer.
    pub(crate) async fn fill_now(&mut self) -> io::Result<bool> {
        let stream = &mut self.stream;
        let rbuf = &mut self.rbuf;
        poll_fn(|cx| {
            let mut tmp = [0u8; 4096];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut **stream).poll_read(cx, &mut rb) {
                Poll::Pending => Poll::Ready(Ok(false)),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(Err(closed())),
                Poll::Ready(Ok(())) => {
                    rbuf.extend_from_slice(rb.filled());
                    Poll::Ready(Ok(true))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            }
        })
        .await
    }

    /// Writes and flushes.
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    )
}
