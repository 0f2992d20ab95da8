//! Errors of the WAL consumer.

use super::pgoutput::DecodeError;

/// Anything that ends a replication session. The consumer task logs it and reconnects; callers
/// of the lower-level API ([`super::conn`], [`super::slot`]) decide for themselves.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// The origin configuration cannot be used for replication (e.g. no TCP host).
    #[error("origin config: {0}")]
    Config(String),
    /// Could not open a TCP connection to the origin.
    #[error("connect to origin {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// Reading or writing the replication socket failed.
    #[error("replication i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The origin closed the connection or ended the COPY stream.
    #[error("origin closed the replication connection")]
    Closed,
    /// The origin sent something the protocol does not allow here.
    #[error("replication protocol: {0}")]
    Protocol(String),
    /// Authentication could not proceed (unsupported method, missing password, SCRAM failure).
    #[error("authentication: {0}")]
    Auth(String),
    /// An `ErrorResponse` from the origin.
    #[error("origin {severity} {code}: {message}")]
    Server {
        severity: String,
        code: String,
        message: String,
    },
    /// A pgoutput payload could not be decoded.
    #[error("pgoutput decode: {0}")]
    Decode(#[from] DecodeError),
    /// A query on the regular (non-replication) connection failed.
    #[error("origin query: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The origin is not configured for logical replication.
    #[error("origin has wal_level={0}; logical replication needs wal_level=logical")]
    WalLevel(String),
}

impl WalError {
    /// The SQLSTATE of a server error, if this is one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            WalError::Server { code, .. } => Some(code),
            WalError::Query(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// Whether reconnecting can help without operator action.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            WalError::Config(_) | WalError::Auth(_) | WalError::WalLevel(_)
        )
    }
}
