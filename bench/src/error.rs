//! The one error type of the tool: where it came from, in words a bench operator can act on.

#![deny(unsafe_code)]

use crate::resp::RespError;

/// Any failure of a subcommand.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The origin PostgreSQL refused or failed.
    #[error("origin: {0}")]
    Pg(#[from] tokio_postgres::Error),
    /// The RESP server refused or failed.
    #[error("{0}")]
    Resp(#[from] RespError),
    /// File or process I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// JSONL that is not a row.
    #[error("jsonl: {0}")]
    Json(#[from] serde_json::Error),
    /// A flag combination or value that cannot work.
    #[error("config: {0}")]
    Config(String),
    /// Chart drawing failed.
    #[error("chart: {0}")]
    Plot(String),
    /// `stale-check --expect-zero` found stale entries.
    #[error("{0} stale entries")]
    Stale(u64),
}
