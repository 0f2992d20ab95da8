//! TLS on a client connection, sans I/O: ciphertext in, plaintext to the session layer;
//! plaintext out, ciphertext to the transport.
//!
//! Purpose: one [`TlsSession`] per encrypted connection wraps a `rustls::ServerConnection`.
//! The transport hands it what it read from the socket ([`TlsSession::ingest`], which appends
//! the decrypted bytes to the connection's input buffer), moves the connection's composed
//! output into it ([`TlsSession::seal`]) and writes what it produced ([`TlsSession::write_to`]).
//! It knows nothing of sockets or of the protocol it carries: the kernel transport uses it for
//! the PostgreSQL front (after `SSLRequest` → `S`) and for the RESP TLS listener.
//!
//! Certificates: every core reads the shared [`TlsAcceptor`] once per new connection
//! (`ArcSwap::load_full`, no lock). The control plane swaps a new `rustls::ServerConfig` in to
//! reload certificates: connections already open keep the configuration they started with.
//!
//! Invariants and bounds: rustls holds at most [`TLS_BUFFER`] bytes of plaintext waiting for the
//! handshake and of ciphertext waiting for the socket; [`TlsSession::seal`] takes only what fits,
//! so the rest stays in the connection's own output buffer, where the reply-backlog bound and
//! the reply-memory accounting see it (backpressure is the same as without TLS). Decrypted input
//! is drained into the connection's buffer after every record batch, so rustls's own input
//! buffers stay at their fixed bounds (one record plus the deframer's buffer).
//!
//! Cost: rustls's buffered API allocates per record (one `Vec` per sealed record, one for the
//! deframer as it grows), so with TLS the hit path is no longer allocation-free; a handshake
//! runs on the core thread (ECDSA P-256 signing: tens of µs; RSA-2048: about 1 ms during which
//! the core's other connections wait). See docs/architecture.md and docs/decisions.md.
//!
//! Thread model: a session is owned by its connection's core; the acceptor is shared by all
//! cores and written by the control plane.

use std::io::{self, Read};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::{ServerConfig, ServerConnection};

use crate::plane::CoreStats;

/// Bytes of pending plaintext (before the handshake ends) and of unsent ciphertext a session
/// holds; past it, output waits in the connection's buffer.
pub const TLS_BUFFER: usize = 64 * 1024;

/// The server configuration new connections get, shared by the cores and replaced on reload.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ArcSwap<ServerConfig>>,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor").finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    pub fn new(config: Arc<ServerConfig>) -> TlsAcceptor {
        TlsAcceptor {
            config: Arc::new(ArcSwap::new(config)),
        }
    }

    /// Connections accepted from now on use `config` (a certificate reload).
    pub fn store(&self, config: Arc<ServerConfig>) {
        self.config.store(config);
    }

    /// The configuration new connections get now.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    /// A server session for a new connection, with the current configuration.
    pub fn accept(&self) -> Result<Box<TlsSession>, rustls::Error> {
        let mut conn = ServerConnection::new(self.config.load_full())?;
        conn.set_buffer_limit(Some(TLS_BUFFER));
        Ok(Box::new(TlsSession {
            conn,
            counted: false,
        }))
    }
}

/// What TLS a PostgreSQL client may or must use (`pgwire.tls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PgTlsMode {
    /// SSLRequest is answered `N`.
    #[default]
    Off,
    /// SSLRequest is answered `S`; plaintext sessions are accepted too.
    On,
    /// As `On`, and a StartupMessage in plaintext is refused as PostgreSQL refuses it with
    /// only `hostssl` lines in pg_hba.conf (FATAL 28000). CancelRequest stays accepted.
    Required,
}

/// TLS on the kernel transport's fronts, composed by the control plane.
#[derive(Clone, Debug)]
pub struct TlsFront {
    /// The PostgreSQL front's configuration (no client certificates).
    pub pg: TlsAcceptor,
    pub pg_mode: PgTlsMode,
    /// The RESP TLS listener's configuration (client certificates per `resp.tls_auth_clients`).
    pub resp: TlsAcceptor,
    /// Where RESP clients connect over TLS (`None`: no RESP TLS listener).
    pub resp_listen: Option<std::net::SocketAddr>,
}

/// One connection's TLS state.
pub struct TlsSession {
    conn: ServerConnection,
    /// The end of its handshake has been counted.
    counted: bool,
}

/// What [`TlsSession::ingest`] saw besides data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingested {
    /// Go on.
    Open,
    /// The peer sent close_notify: no more input will come.
    Closed,
}

impl TlsSession {
    /// Decrypts `cipher` (bytes read from the socket), appending the plaintext to `plain`.
    /// An error is fatal to the connection: rustls has queued an alert ([`TlsSession::write_to`]
    /// sends it); handshakes that end or fail are counted in `stats`.
    pub fn ingest(
        &mut self,
        mut cipher: &[u8],
        plain: &mut Vec<u8>,
        stats: &CoreStats,
    ) -> Result<Ingested, rustls::Error> {
        let mut closed = false;
        while !cipher.is_empty() && !closed {
            match self.conn.read_tls(&mut cipher) {
                Ok(0) => closed = true,
                Ok(_) => {}
                // Only "received plaintext buffer full", which draining below prevents.
                Err(e) => return Err(rustls::Error::General(e.to_string())),
            }
            let state = match self.conn.process_new_packets() {
                Ok(state) => state,
                Err(e) => {
                    if !self.counted {
                        self.counted = true;
                        CoreStats::add(&stats.tls_handshake_failures, 1);
                    }
                    return Err(e);
                }
            };
            if !self.counted && !self.conn.is_handshaking() {
                self.counted = true;
                CoreStats::add(&stats.tls_handshakes, 1);
            }
            let n = state.plaintext_bytes_to_read();
            if n > 0 {
                let start = plain.len();
                plain.resize(start + n, 0);
                if self.conn.reader().read_exact(&mut plain[start..]).is_err() {
                    plain.truncate(start);
                    return Err(rustls::Error::General("plaintext lost".into()));
                }
            }
            closed |= state.peer_has_closed();
        }
        Ok(if closed {
            Ingested::Closed
        } else {
            Ingested::Open
        })
    }

    /// Takes as much of `plain` as the session's buffer holds (encrypted once the handshake is
    /// done); returns how much it took.
    pub fn seal(&mut self, plain: &[u8]) -> usize {
        // rustls's writer takes what fits under the buffer limit and never fails before the
        // connection has failed (then the caller closes it anyway).
        io::Write::write(&mut self.conn.writer(), plain).unwrap_or(0)
    }

    /// Whether ciphertext is waiting to be written.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Writes waiting ciphertext to `out` (one `write` call; `WouldBlock` passes through).
    pub fn write_to(&mut self, out: &mut dyn io::Write) -> io::Result<usize> {
        self.conn.write_tls(out)
    }

    /// Queues close_notify (written by the next [`TlsSession::write_to`]).
    pub fn close(&mut self) {
        self.conn.send_close_notify();
    }

    /// The handshake is over.
    pub fn established(&self) -> bool {
        !self.conn.is_handshaking()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_fails_the_handshake_with_an_alert_and_is_counted() {
        // A self-signed configuration is not needed to see a garbage ClientHello refused:
        // any valid ServerConfig will do, and building one needs a key. Use rustls's own
        // resolver-less config: no certificates, so the handshake cannot succeed either way.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(NoCert));
        let acceptor = TlsAcceptor::new(Arc::new(config));
        let stats = CoreStats::default();
        let mut session = acceptor.accept().expect("session");
        let mut plain = Vec::new();
        let garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(session.ingest(garbage, &mut plain, &stats).is_err());
        assert!(plain.is_empty());
        assert!(session.wants_write(), "an alert is queued");
        let mut out = Vec::new();
        session.write_to(&mut out).expect("to a Vec");
        assert_eq!(out[0], 0x15, "a TLS alert record");
        assert_eq!(
            stats
                .tls_handshake_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[derive(Debug)]
    struct NoCert;
    impl rustls::server::ResolvesServerCert for NoCert {
        fn resolve(
            &self,
            _: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            None
        }
    }
}
