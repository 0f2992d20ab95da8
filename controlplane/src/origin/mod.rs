//! The origin connector: the one place pgline opens a protocol connection to its origin.
//!
//! Purpose: every raw protocol 3.0 connection pgline makes to the origin (the replication
//! stream, the relay's backends, the relay's cancel requests) is opened here, over TCP and,
//! as `sslmode` says, TLS ([`tls`]); pgline's own logins go through [`connect`] (open, then
//! [`login`]: startup, authentication by cleartext password, md5 or SCRAM-SHA-256, then the
//! origin's parameters and BackendKeyData up to ReadyForQuery), host after host of a
//! multi-host `origin.url` until one has the `target_session_attrs` asked for. A relayed login
//! (the client answers the origin's authentication) runs over a connection from [`open`] and
//! reads the same messages with [`auth_request`] and [`backend_key`]; [`data_row`] and
//! [`error_fields`] read what queries return. The fills, the catalog reads and the slot
//! management run on `tokio-postgres`, which logs in by itself; they take their TLS connector
//! from [`Settings::pg_tls`], built on the same `rustls` configuration.
//!
//! ```text
//!   wal::ReplicationConn ─┐
//!   pgfront::Backend ─────┼─▶ OriginConn (OriginStream: TCP or TLS, + frame reader) ─▶ login()
//!   pgfront send_cancel ──┘
//!   fills, catalog, slots ──▶ tokio-postgres with Settings::pg_tls()
//! ```
//!
//! Invariants: `origin.url` is read once into [`Settings`] (`url` takes out what
//! `tokio-postgres` cannot parse); a backend message longer than [`MAX_FRAME`] is an error
//! (bounded buffering); reads are cancel-safe (partial input stays in the connection's
//! buffer); a connection is usable for queries only after [`login`] (or a relayed login) saw
//! ReadyForQuery; after the origin's `S` to an SSLRequest no byte may precede the handshake
//! (CVE-2021-23222: such bytes would be unauthenticated).
//!
//! Thread model: a connection is owned by one task at a time. [`Settings`] is cloned into each
//! user; its [`Primary`] (which host last proved read-write) is shared by the clones.
//!
//! Limitations: TCP only (Unix-socket hosts are left out of the raw connector); `hostaddr` is
//! not used by the raw connector; `sslmode=allow` is refused, and `prefer` does not retry in
//! plaintext after a failed handshake (libpq does).

mod conn;
mod login;
mod message;
pub mod tls;
pub mod url;

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::config::Host;

pub use conn::{FrameError, OriginConn, MAX_FRAME};
pub use login::{login, Credentials, LoggedIn, LoginError};
pub use message::{auth_request, backend_key, data_row, error_fields};
pub use tls::{OriginTls, PgTls};
pub use url::{SessionAttrs, SslMode};

/// Where the origin listens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginAddr {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for OriginAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The index (in `origin.url`'s host list) of the host that last proved read-write; shared by
/// every clone of one [`Settings`]. Relayed logins cannot be replayed on another host, so they
/// start with this one.
#[derive(Debug, Default)]
pub struct Primary(AtomicUsize);

impl Primary {
    /// The host to try first.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// `index` proved read-write.
    pub fn set(&self, index: usize) {
        self.0.store(index, Ordering::Relaxed);
    }

    /// `index` is not (or no longer) read-write: start with the next one.
    pub fn forget(&self, index: usize, hosts: usize) {
        if hosts > 0 {
            let _ = self.0.compare_exchange(
                index,
                (index + 1) % hosts,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

/// `origin.url`, read once: what `tokio-postgres` is given, the TLS settings, and the session
/// attributes the raw connector checks.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The connection settings for `tokio-postgres` (`sslmode` mapped, see `url`).
    pub pg: tokio_postgres::Config,
    pub tls: Arc<OriginTls>,
    pub attrs: SessionAttrs,
    pub primary: Arc<Primary>,
}

impl Settings {
    /// Reads `url` (either form). The error names the key at fault.
    pub fn parse(url: &str) -> Result<Settings, String> {
        let split = url::split(url).map_err(|e| e.to_string())?;
        let mut pg: tokio_postgres::Config = split.rest.parse().map_err(|e| format!("{e}"))?;
        let tls = OriginTls::new(&split.tls)?;
        pg.ssl_mode(tls.mode.for_tokio_postgres());
        Ok(Settings {
            pg,
            tls: Arc::new(tls),
            attrs: split.attrs,
            primary: Arc::default(),
        })
    }

    /// Only the driver's part of `url` (hosts, user, database...): no TLS files are read, for
    /// callers that just want to know who and where (status pages, the engine's cache user).
    pub fn parse_pg(url: &str) -> Result<tokio_postgres::Config, String> {
        let split = url::split(url).map_err(|e| e.to_string())?;
        split.rest.parse().map_err(|e| format!("{e}"))
    }

    /// The `tokio-postgres` TLS connector (fills, catalog, slots, the relay's own session).
    pub fn pg_tls(&self) -> PgTls {
        self.tls.pg_tls()
    }

    /// The TCP hosts, in `origin.url`'s order.
    pub fn addrs(&self) -> Vec<OriginAddr> {
        tcp_addrs(&self.pg)
    }
}

/// The TCP hosts of `config`, each with its port (the port list pairs with the host list; one
/// port serves every host; 5432 by default). Unix-socket hosts are left out.
pub fn tcp_addrs(config: &tokio_postgres::Config) -> Vec<OriginAddr> {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| match host {
            Host::Tcp(name) => Some(OriginAddr {
                host: name.clone(),
                port: ports.get(i).or(ports.first()).copied().unwrap_or(5432),
            }),
            #[cfg(unix)]
            Host::Unix(_) => None,
        })
        .collect()
}

/// Why [`connect`] found no host to use.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `origin.url` names no TCP host.
    #[error("no TCP host in origin.url")]
    NoHost,
    /// The last host tried could not be reached.
    #[error("connect to origin {addr}: {source}")]
    Open { addr: OriginAddr, source: io::Error },
    /// The last host tried refused the login.
    #[error("origin {addr}: {source}")]
    Login {
        addr: OriginAddr,
        source: LoginError,
    },
    /// Every host was reached, none had the session attributes asked for.
    #[error("no origin host is {0} (target_session_attrs); tried {1}")]
    NoMatch(&'static str, String),
}

/// Opens a connection to the first of `settings`' hosts that accepts one, starting with the
/// last known primary: the connection and the index of its host. Nothing is sent but the TLS
/// negotiation (a relayed login's startup goes next).
pub async fn open(
    settings: &Settings,
    timeout: Option<Duration>,
    buffer: usize,
) -> Result<(OriginConn, usize), ConnectError> {
    let addrs = settings.addrs();
    let mut last = ConnectError::NoHost;
    for index in host_order(settings, addrs.len()) {
        let addr = &addrs[index];
        match OriginConn::open(addr, timeout, &settings.tls, buffer).await {
            Ok(conn) => return Ok((conn, index)),
            Err(source) => {
                last = ConnectError::Open {
                    addr: addr.clone(),
                    source,
                }
            }
        }
    }
    Err(last)
}

/// The hosts' indexes, the last known primary first.
fn host_order(settings: &Settings, n: usize) -> impl Iterator<Item = usize> {
    let first = if n == 0 {
        0
    } else {
        settings.primary.get() % n
    };
    (0..n).map(move |i| (first + i) % n)
}

/// Opens and logs in (pgline's own login: `startup` as `who`) to the first host that accepts
/// and has `settings.attrs`, starting with the last known primary; a host that is up but of
/// the wrong kind is closed and the next one tried (`timeout`: for each host's connection and
/// TLS handshake). The connection, what [`login`] read, and the host's index.
pub async fn connect(
    settings: &Settings,
    timeout: Option<Duration>,
    startup: &[u8],
    who: Credentials<'_>,
    buffer: usize,
) -> Result<(OriginConn, LoggedIn, usize), ConnectError> {
    let addrs = settings.addrs();
    let mut last = ConnectError::NoHost;
    let mut wrong_kind = Vec::new();
    for index in host_order(settings, addrs.len()) {
        let addr = &addrs[index];
        let mut conn = match OriginConn::open(addr, timeout, &settings.tls, buffer).await {
            Ok(c) => c,
            Err(source) => {
                last = ConnectError::Open {
                    addr: addr.clone(),
                    source,
                };
                continue;
            }
        };
        let logged = match login(&mut conn, startup, who).await {
            Ok(l) => l,
            Err(source) => {
                last = ConnectError::Login {
                    addr: addr.clone(),
                    source,
                };
                continue;
            }
        };
        match session_fits(settings.attrs, &logged.params) {
            Ok(()) => {
                if settings.attrs == SessionAttrs::ReadWrite {
                    settings.primary.set(index);
                }
                return Ok((conn, logged, index));
            }
            Err(why) => {
                if settings.attrs == SessionAttrs::ReadWrite {
                    settings.primary.forget(index, addrs.len());
                }
                tracing::info!(origin = %addr, "origin host skipped: {why}");
                wrong_kind.push(format!("{addr} ({why})"));
                let mut bye = bytes::BytesMut::new();
                postgres_protocol::message::frontend::terminate(&mut bye);
                let _ = conn.write_all(&bye).await;
            }
        }
    }
    if !wrong_kind.is_empty() && !matches!(last, ConnectError::Login { .. }) {
        let kind = match settings.attrs {
            SessionAttrs::ReadOnly => "read-only",
            _ => "read-write",
        };
        return Err(ConnectError::NoMatch(kind, wrong_kind.join(", ")));
    }
    Err(last)
}

/// Whether a session whose login reported `params` has the attributes `attrs`: `Err` says why
/// not. Read-write means neither `in_hot_standby` nor `default_transaction_read_only` is on
/// (both reported at login since PostgreSQL 14).
pub fn session_fits(attrs: SessionAttrs, params: &[(String, String)]) -> Result<(), String> {
    if attrs == SessionAttrs::Any {
        return Ok(());
    }
    let get = |name: &str| {
        params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let Some(standby) = get("in_hot_standby") else {
        return Err("it did not report in_hot_standby (PostgreSQL 14 or later needed)".into());
    };
    let read_only = standby == "on" || get("default_transaction_read_only") == Some("on");
    match (attrs, read_only) {
        (SessionAttrs::ReadWrite, true) if standby == "on" => Err("in hot standby".into()),
        (SessionAttrs::ReadWrite, true) => Err("default_transaction_read_only is on".into()),
        (SessionAttrs::ReadOnly, false) => Err("read-write".into()),
        _ => Ok(()),
    }
}

/// The byte stream of an origin connection: plain TCP, or TLS over it.
pub enum OriginStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl OriginStream {
    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, OriginStream::Tls(_))
    }

    /// The TLS version and cipher suite, when encrypted.
    pub fn tls_summary(&self) -> Option<String> {
        let OriginStream::Tls(s) = self else {
            return None;
        };
        let (_, c) = s.get_ref();
        Some(format!(
            "{} {}",
            c.protocol_version()
                .and_then(|v| v.as_str())
                .unwrap_or("TLS")
                .replace('_', "."),
            c.negotiated_cipher_suite()
                .and_then(|s| s.suite().as_str())
                .unwrap_or("")
        ))
    }
}

impl AsyncRead for OriginStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            OriginStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            OriginStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for OriginStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            OriginStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            OriginStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            OriginStream::Plain(s) => Pin::new(s).poll_flush(cx),
            OriginStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            OriginStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            OriginStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The SSLRequest code (protocol 3.0's magic 1234.5679).
const SSL_REQUEST: i32 = 80_877_103;

/// Opens the byte stream to `addr` and negotiates TLS as `tls` says, giving up after `timeout`
/// (none: the system's) for the whole of it.
async fn open_stream(
    addr: &OriginAddr,
    timeout: Option<Duration>,
    tls: &OriginTls,
) -> io::Result<OriginStream> {
    let attempt = open_stream_now(addr, tls);
    match timeout {
        Some(t) => tokio::time::timeout(t, attempt)
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?,
        None => attempt.await,
    }
}

async fn open_stream_now(addr: &OriginAddr, tls: &OriginTls) -> io::Result<OriginStream> {
    let mut tcp = TcpStream::connect((addr.host.as_str(), addr.port)).await?;
    tcp.set_nodelay(true)?;
    if !tls.wanted() {
        return Ok(OriginStream::Plain(tcp));
    }
    if !tls.direct {
        let mut req = [0u8; 8];
        req[..4].copy_from_slice(&8i32.to_be_bytes());
        req[4..].copy_from_slice(&SSL_REQUEST.to_be_bytes());
        tcp.write_all(&req).await?;
        // Exactly one byte: whatever follows an `S` belongs to the handshake.
        match tcp.read_u8().await? {
            b'S' => {}
            // `N`: no TLS here; `E`: a server too old to know the request.
            b'N' | b'E' if !tls.required() => return Ok(OriginStream::Plain(tcp)),
            b'N' | b'E' => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "origin {addr} does not support SSL, but sslmode={}",
                        tls.mode.as_str()
                    ),
                ))
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("origin {addr} answered the SSLRequest with byte {other:#04x}"),
                ))
            }
        }
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        if let Ok(n) = socket2::SockRef::from(&tcp).peek(&mut probe) {
            if n > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("origin {addr}: received unencrypted data after SSL response"),
                ));
            }
        }
    }
    let name = rustls::pki_types::ServerName::try_from(addr.host.clone()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("origin host '{}' is not a valid TLS server name", addr.host),
        )
    })?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    match connector.connect(name, tcp).await {
        Ok(s) => Ok(OriginStream::Tls(Box::new(s))),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("TLS with origin {addr}: {}", tls::describe(&e)),
        )),
    }
}

/// The text of an origin error and of every error under it (`tokio-postgres` and deadpool
/// keep the cause, e.g. the certificate check that failed, out of their own text), with the
/// hint of [`hint_refusal`].
pub fn describe_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut next = Some(e);
    while let Some(level) = next {
        let part = match level.downcast_ref::<io::Error>() {
            Some(io) => tls::describe(io),
            None => level.to_string(),
        };
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        next = level.source();
    }
    hint_refusal(&text)
}

/// The origin's message, with a hint when it refused a connection because it was not
/// encrypted (a `hostssl`-only `pg_hba.conf` and `sslmode=disable`).
pub fn hint_refusal(message: &str) -> String {
    if message.contains("no encryption") {
        format!(
            "{message} (hint: the origin accepts only TLS connections (hostssl): set \
             sslmode=require or stronger in origin.url)"
        )
    } else {
        message.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn session_attrs_from_the_login_parameters() {
        let primary = params(&[
            ("in_hot_standby", "off"),
            ("default_transaction_read_only", "off"),
        ]);
        let standby = params(&[
            ("in_hot_standby", "on"),
            ("default_transaction_read_only", "off"),
        ]);
        let ro = params(&[
            ("in_hot_standby", "off"),
            ("default_transaction_read_only", "on"),
        ]);
        assert!(session_fits(SessionAttrs::ReadWrite, &primary).is_ok());
        assert!(session_fits(SessionAttrs::ReadWrite, &standby)
            .unwrap_err()
            .contains("hot standby"));
        assert!(session_fits(SessionAttrs::ReadWrite, &ro).is_err());
        assert!(session_fits(SessionAttrs::ReadOnly, &standby).is_ok());
        assert!(session_fits(SessionAttrs::ReadOnly, &primary).is_err());
        assert!(session_fits(SessionAttrs::Any, &[]).is_ok());
        assert!(session_fits(SessionAttrs::ReadWrite, &[]).is_err());
    }

    #[test]
    fn the_last_known_primary_goes_first() {
        let s = Settings::parse("host=a,b,c port=1 user=u sslmode=disable").unwrap();
        assert_eq!(host_order(&s, 3).collect::<Vec<_>>(), [0, 1, 2]);
        s.primary.set(2);
        assert_eq!(host_order(&s, 3).collect::<Vec<_>>(), [2, 0, 1]);
        s.primary.forget(2, 3);
        assert_eq!(host_order(&s, 3).collect::<Vec<_>>(), [0, 1, 2]);
        // Another task already moved on: a stale forget changes nothing.
        s.primary.forget(2, 3);
        assert_eq!(s.primary.get(), 0);
    }

    #[test]
    fn refused_for_no_encryption_gets_a_hint() {
        let m = "no pg_hba.conf entry for host \"127.0.0.1\", user \"u\", database \"d\", no encryption";
        assert!(hint_refusal(m).contains("sslmode=require"));
        assert_eq!(
            hint_refusal("password authentication failed"),
            "password authentication failed"
        );
    }
}
