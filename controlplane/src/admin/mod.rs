//! Admin operations behind the REST API: which tables are cached and in what state, adding,
//! removing and warming tables, flushes, "is this key cached, since which LSN, and if not why",
//! the effective config and live changes to it.
//!
//! Purpose: one typed surface ([`AdminError`], [`TableStatus`], [`KeyInfo`] and the [`Admin`]
//! service in [`ops`]) that the HTTP layer maps to routes and status codes; nothing here knows
//! HTTP, nor how the node was started (the composition root, `crate::server`, hands the service
//! its parts).
//!
//! Invariants: every change to the store or the catalog goes through the store writer as an
//! `AdminCmd`, so it is ordered with fills and WAL changes. Keys are parsed with the cores' own
//! key space (`KeySpace::resolve`) and checked with the fill's `keytext` rules, so the API and a
//! RESP `GET` always agree on what a key names. Warming fills rows through the miss path's leases
//! (coherent with concurrent writes). Secrets (`*.password`, `*.token`, a password inside
//! `origin.url`) never leave through [`Admin::effective_config`].
//!
//! Thread model: the methods take `&self` and may be called from any tokio task at once
//! (the [`Admin`] sits behind an `Arc`, shared by the node and the HTTP server). Table states
//! live in a mutex-guarded map written by the warming tasks; the effective config in an
//! `RwLock`.
//!
//! Limitations: per-table entry counts are as of at most 2 s ago (the writer copies the store's
//! own counts every 2 s); "evicted" and "never read" cannot be told apart for an uncached key; after a replication
//! reconnect the WAL consumer re-adds its start-up table list to a table-list publication, so a
//! removed table may be published again (its changes are ignored, at some decoding cost).
//! Tables added or removed at run time show in the effective `catalog.tables` only in table-list
//! mode (in every-table mode a removed table is not representable there; in table-list mode a
//! list emptied by removals reads like every-table mode, which it is not until a restart), and
//! nothing is written back to the config file.

pub mod ops;
pub mod patch;

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

pub use ops::{
    Admin, AdminParts, ClusterChange, ClusterChangeRequest, ClusterNodeView, ClusterShardView,
    ClusterView,
};
pub use patch::LIVE_KEYS;

/// Replaces the process's log filter (installed by whoever set up `tracing`).
pub type LogReload = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// A [`LogReload`] for a `tracing_subscriber` `EnvFilter` behind a reload layer
/// (`tracing_subscriber::reload::Layer::new(filter)` gives the handle); hand it to
/// [`Admin::set_log_reload`] to make `log.level` live.
pub fn env_filter_reload<S: 'static>(
    handle: tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, S>,
) -> LogReload {
    Box::new(move |level| {
        let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

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
    /// Entries in the store (negative ones included) as of at most 2 s ago; `None` in the first
    /// 2 s after start.
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

/// States other than `Active` of tables added at run time. Each warming run owns an epoch; a
/// run that was superseded (its table removed, or removed and added again) cannot overwrite
/// the state of the next one.
#[derive(Debug, Default)]
pub struct TableStates {
    inner: Mutex<Runs>,
}

#[derive(Debug, Default)]
struct Runs {
    last_epoch: u64,
    /// Table id -> (epoch of its run, state).
    by_table: HashMap<u32, (u64, TableState)>,
}

impl TableStates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The table's state (`Active` when none is recorded).
    pub fn get(&self, id: u32) -> TableState {
        self.lock()
            .by_table
            .get(&id)
            .map_or(TableState::Active, |(_, s)| s.clone())
    }

    /// Starts a warming run: `Warming { 0, 0 }`; returns its epoch.
    pub fn begin(&self, id: u32) -> u64 {
        let mut g = self.lock();
        g.last_epoch += 1;
        let epoch = g.last_epoch;
        g.by_table
            .insert(id, (epoch, TableState::Warming { done: 0, total: 0 }));
        epoch
    }

    /// Back to `Active`, whatever run was going on.
    pub fn clear(&self, id: u32) {
        self.lock().by_table.remove(&id);
    }

    /// Sets the state of run `epoch` (`Active` clears it); false if that run was superseded.
    pub fn update(&self, id: u32, epoch: u64, state: TableState) -> bool {
        let mut g = self.lock();
        if g.by_table.get(&id).map(|(e, _)| *e) != Some(epoch) {
            return false;
        }
        if state == TableState::Active {
            g.by_table.remove(&id);
        } else {
            g.by_table.insert(id, (epoch, state));
        }
        true
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_filter_reload_checks_and_swaps_the_filter() {
        let (layer, handle) =
            tracing_subscriber::reload::Layer::<_, tracing_subscriber::Registry>::new(
                tracing_subscriber::EnvFilter::new("info"),
            );
        let reload = env_filter_reload(handle.clone());
        reload("pgline=debug,warn").unwrap();
        let now = handle.with_current(|f| f.to_string()).unwrap();
        assert!(now.contains("pgline=debug"), "{now}");
        assert!(reload("pgline=loud").is_err());
        drop(layer);
        assert!(reload("info").is_err(), "no subscriber left to reload");
    }

    #[test]
    fn errors_serialize_as_the_api_error_shape() {
        let e = AdminError::RestartRequired("resp.listen needs a restart".into());
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"error": "restart_required", "detail": "resp.listen needs a restart"})
        );
        let s = TableState::Warming { done: 1, total: 2 };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"state": "warming", "done": 1, "total": 2})
        );
    }
}
