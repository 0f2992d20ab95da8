//! Admin operations behind the REST API: which tables are cached and in what state, adding,
//! removing and warming tables, flushes, "is this key cached, since which LSN, and if not why",
//! the effective config and live changes to it.
//!
//! Purpose: one typed surface ([`AdminError`], [`TableStatus`], [`KeyInfo`] and the `impl Pgline`
//! methods in [`ops`]) that the HTTP layer maps to routes and status codes; nothing here knows
//! HTTP.
//!
//! Invariants: every change to the store or the catalog goes through the store writer as an
//! `AdminCmd`, so it is ordered with fills and WAL changes. Keys are parsed with the cores' own
//! key space (`KeySpace::resolve`) and checked with the fill's `keytext` rules, so the API and a
//! RESP `GET` always agree on what a key names. Warming fills rows through the miss path's leases
//! (coherent with concurrent writes). Secrets (`*.password`, `*.token`, a password inside
//! `origin.url`) never leave through [`Pgline::effective_config`](crate::server::Pgline).
//!
//! Thread model: the methods take `&self` and may be called from any tokio task at once
//! (`Pgline` sits behind an `Arc` in the HTTP server). Table states live in a mutex-guarded map
//! written by the warming tasks; the effective config in an `RwLock`.
//!
//! Limitations: per-table entry counts are not tracked (`TableStatus::entries` is `None`);
//! "evicted" and "never read" cannot be told apart for an uncached key; after a replication
//! reconnect the WAL consumer re-adds its start-up table list to a table-list publication, so a
//! removed table may be published again (its changes are ignored, at some decoding cost).

pub mod ops;
pub mod patch;

use serde::Serialize;

pub use patch::LIVE_KEYS;

/// Why an admin operation failed; the HTTP layer maps each to a status code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "error", content = "detail", rename_all = "snake_case")]
pub enum AdminError {
    /// No such table (on the origin or in the cache) or key prefix: 404.
    #[error("not found: {0}")]
    NotFound(String),
    /// A malformed key, a bad config value, an unknown config key, a table without a key: 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The table is cached already, or another operation is in the way: 409.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The config change names settings read only at start-up: 409.
    #[error("restart required: {0}")]
    RestartRequired(String),
    /// The origin failed or is unreachable: 502/503.
    #[error("origin: {0}")]
    Origin(String),
}

/// One cached table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TableStatus {
    /// `schema.table`.
    pub name: String,
    /// How its keys are spelled, e.g. `users:{id}` (`t:{a}:{b}` for a two-column key).
    pub key_template: String,
    /// Every prefix its keys answer to (`public.users`, `users`, configured ones).
    pub prefixes: Vec<String>,
    /// Primary-key columns, in key order.
    pub primary_key: Vec<String>,
    pub columns: usize,
    /// Its keys resolve (always true for a cached table today: removing it is the way to stop).
    pub enabled: bool,
    pub state: TableState,
    /// Entries in the store, when known.
    pub entries: Option<u64>,
}

/// A table's life cycle after it was added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TableState {
    Active,
    /// Rows are being filled: `done` of about `total` (a row count taken when warming began).
    Warming {
        done: u64,
        total: u64,
    },
    /// Warming stopped; the table is cached and fills on misses as usual.
    Failed {
        detail: String,
    },
}

/// What the cache knows about one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct KeyInfo {
    pub key: String,
    /// `schema.table` of the table its prefix names.
    pub table: Option<String>,
    pub cached: bool,
    /// Cached as "no such row".
    pub negative: bool,
    /// LSN of the version cached, PostgreSQL text form (`16/B374D848`).
    pub lsn: Option<String>,
    pub size_bytes: Option<u64>,
    /// Milliseconds since this version was installed.
    pub age_ms: Option<u64>,
    /// Why it is not cached, or why a cached entry is not served right now.
    pub reason: Option<String>,
}
