//! The origin connector: the one place pgline opens a protocol connection to its origin.
//!
//! Purpose: every raw protocol 3.0 connection pgline makes to the origin (the replication
//! stream, the relay's backends, the relay's cancel requests) is opened by [`OriginConn::open`]
//! and logged in, when pgline itself logs in, by [`login`] (startup, authentication by
//! cleartext password, md5 or SCRAM-SHA-256, then the origin's parameters and BackendKeyData
//! up to ReadyForQuery). A relayed login (the client answers the origin's authentication) runs
//! over the same connection type and reads the same messages with [`auth_request`] and
//! [`backend_key`]; [`data_row`] and [`error_fields`] read what queries return. The fills, the catalog reads and the slot management run on
//! `tokio-postgres`, which logs in by itself; they take their TLS setting from [`pg_tls`].
//!
//! ```text
//!   wal::ReplicationConn ─┐
//!   pgfront::Backend ─────┼─▶ OriginConn (OriginStream + frame reader) ─▶ login()
//!   pgfront send_cancel ──┘
//!   fills, catalog, slots ──▶ tokio-postgres with pg_tls()
//! ```
//!
//! Invariants: a backend message longer than [`MAX_FRAME`] is an error (bounded buffering);
//! reads are cancel-safe (partial input stays in the connection's buffer); a connection is
//! usable for queries only after [`login`] (or a relayed login) saw ReadyForQuery.
//!
//! Thread model: a connection is owned by one task at a time; nothing here is shared.
//!
//! Limitations: TCP only, no TLS yet. [`OriginStream`] is the one type to change when TLS
//! comes (issue 14): the connector owns it, its callers see only [`OriginConn`].

mod conn;
mod login;
mod message;

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_postgres::config::Host;

pub use conn::{FrameError, OriginConn, MAX_FRAME};
pub use login::{login, Credentials, LoggedIn, LoginError};
pub use message::{auth_request, backend_key, data_row, error_fields};

/// Where the origin listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginAddr {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for OriginAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The byte stream of an origin connection (TLS will wrap it here).
pub type OriginStream = TcpStream;

/// The TLS setting of the `tokio-postgres` connections to the origin (fills, catalog, slots).
pub type PgTls = tokio_postgres::NoTls;

/// The TLS connector for `tokio-postgres` connections to the origin.
pub fn pg_tls() -> PgTls {
    tokio_postgres::NoTls
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

/// Opens a connection to the first of `config`'s TCP hosts that accepts one, within its
/// connect timeout: the connection, or the last host's error (`None`: no TCP host at all).
pub async fn open_first(
    config: &tokio_postgres::Config,
    buffer: usize,
) -> Result<OriginConn, Option<(OriginAddr, io::Error)>> {
    let mut last = None;
    for addr in tcp_addrs(config) {
        match OriginConn::open(&addr, config.get_connect_timeout().copied(), buffer).await {
            Ok(conn) => return Ok(conn),
            Err(e) => last = Some((addr, e)),
        }
    }
    Err(last)
}

/// Opens the byte stream to `addr`, giving up after `timeout` (none: the system's).
async fn open_stream(addr: &OriginAddr, timeout: Option<Duration>) -> io::Result<OriginStream> {
    let attempt = TcpStream::connect((addr.host.as_str(), addr.port));
    let stream = match timeout {
        Some(t) => tokio::time::timeout(t, attempt)
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??,
        None => attempt.await?,
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}
