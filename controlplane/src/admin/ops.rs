//! The admin service: the node's operations behind the REST API (see the module doc of
//! [`crate::admin`]). The composition root (`crate::server`) builds one [`Admin`] from the
//! parts it started; the API holds it, and nothing here knows how the node was wired.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use pgline_dataplane::plane::Shared;
use pgline_dataplane::store::StoreStats;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use super::patch::{self, restart_hint, LIVE_KEYS};
use super::{AdminError, KeyInfo, LogReload, TableState, TableStates, TableStatus};
use crate::catalog::{self, CatalogCell, CatalogError, TableInfo};
use crate::config::{CertInfo, Config, FrontTls, Runtime, TlsError};
use crate::keytext::{check_key_text, KeyCheck};
use crate::lsn::format_lsn;
use crate::metrics::{NicCounters, NicPortSnapshot};
use crate::pgfront::RelayState;
use crate::wal::ReplicationState;
use crate::writer::{AdminCmd, EntryCounts};

mod advise;
mod cluster;
mod warm;

pub use cluster::{
    ClusterChange, ClusterChangeRequest, ClusterNodeView, ClusterShardView, ClusterView,
};

/// Longest wait for transactions older than a table's joining the publication.
const OLDER_TXN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A key split into its table and pk text.
type ParsedKey = (Arc<TableInfo>, Box<[u8]>);

/// The node's operations: read-only views for status and metrics, and every admin change
/// (tables, flushes, config), each sent to the store writer as an [`AdminCmd`].
///
/// Thread model: shared (`Arc`) by the node and the HTTP API; every method takes `&self`.
pub struct Admin {
    /// The plane's read-only view (counters, gauges, the store reader, the key space).
    pub shared: Arc<Shared>,
    pub repl: Arc<ReplicationState>,
    /// The catalog as the store writer last published it (tables added or removed at run time
    /// included).
    pub catalog: Arc<CatalogCell>,
    /// The store writer's command channel.
    writer: mpsc::Sender<AdminCmd>,
    pool: deadpool_postgres::Pool,
    /// The effective config, secrets included (redacted only on the way out).
    cfg: RwLock<Config>,
    runtime: Arc<Runtime>,
    /// States of tables added at run time (warming progress).
    states: Arc<TableStates>,
    /// Whether the catalog is the configured table list (not every table with a key): tables
    /// added or removed at run time are then added to or removed from `catalog.tables`.
    table_list: bool,
    /// Entries per table, as the writer last counted them.
    entry_counts: Arc<EntryCounts>,
    log_reload: RwLock<Option<LogReload>>,
    /// Serializes add/remove/config changes (each is a read-check-write over several parts).
    admin_lock: tokio::sync::Mutex<()>,
    /// Turns true when the node stops (warming tasks end).
    shutdown: watch::Receiver<bool>,
    started_at: Instant,
    /// The PostgreSQL relay, None when the front is off.
    pg_relay: Option<Arc<RelayState>>,
    /// The PostgreSQL listener of core 0, None when the front is off.
    pg_addr: Option<SocketAddr>,
    /// Device counters of the NIC ports the cores serve on (`nic.mode = "dpdk"`).
    nic: Vec<Arc<dyn NicCounters>>,
    /// TLS on the fronts, None when neither front serves it.
    tls: Option<Arc<FrontTls>>,
    /// Cluster mode: the `[cluster]` section the health task follows (`PUT /v1/cluster`).
    cluster: Option<watch::Sender<crate::config::ClusterConfig>>,
}

/// What [`Admin::new`] is built from (the composition root's parts).
pub struct AdminParts {
    pub shared: Arc<Shared>,
    pub repl: Arc<ReplicationState>,
    pub catalog: Arc<CatalogCell>,
    pub writer: mpsc::Sender<AdminCmd>,
    pub pool: deadpool_postgres::Pool,
    pub cfg: Config,
    pub runtime: Arc<Runtime>,
    pub entry_counts: Arc<EntryCounts>,
    pub shutdown: watch::Receiver<bool>,
    pub pg_relay: Option<Arc<RelayState>>,
    pub pg_addr: Option<SocketAddr>,
    pub nic: Vec<Arc<dyn NicCounters>>,
    pub tls: Option<Arc<FrontTls>>,
    pub cluster: Option<watch::Sender<crate::config::ClusterConfig>>,
}

impl Admin {
    pub fn new(parts: AdminParts) -> Admin {
        let AdminParts {
            shared,
            repl,
            catalog,
            writer,
            pool,
            cfg,
            runtime,
            entry_counts,
            shutdown,
            pg_relay,
            pg_addr,
            nic,
            tls,
            cluster,
        } = parts;
        Admin {
            shared,
            repl,
            catalog,
            writer,
            pool,
            table_list: !cfg.catalog.tables.is_empty(),
            cfg: RwLock::new(cfg),
            runtime,
            states: Arc::default(),
            entry_counts,
            log_reload: RwLock::new(None),
            admin_lock: tokio::sync::Mutex::new(()),
            shutdown,
            started_at: Instant::now(),
            pg_relay,
            pg_addr,
            nic,
            tls,
            cluster,
        }
    }

    /// Reloads the fronts' certificate and key from `[tls]`'s files (`POST /v1/tls/reload`,
    /// SIGHUP): new connections get the new one; on error the old one stays in use. `None`
    /// when no front serves TLS.
    pub fn reload_tls(&self) -> Option<Result<CertInfo, TlsError>> {
        let tls = self.tls.as_ref()?;
        let result = tls.reload();
        match &result {
            Ok(info) => tracing::info!(
                cert_file = %info.cert_file,
                leaf_sha256 = %info.leaf_sha256,
                "TLS certificate reloaded"
            ),
            Err(e) => tracing::error!(error = %e, "TLS reload failed: the old certificate stays"),
        }
        Some(result)
    }

    // ---- views --------------------------------------------------------------------------

    /// Time since the node started.
    pub fn uptime(&self) -> Duration {
        self.started_at.elapsed()
    }

    /// The LSN up to which WAL changes are applied to the store.
    pub fn applied_lsn(&self) -> u64 {
        self.repl.applied_lsn.load(Ordering::Acquire)
    }

    /// The bound PostgreSQL listener address of core 0; None with `pgwire.enabled = false`.
    pub fn pg_addr(&self) -> Option<SocketAddr> {
        self.pg_addr
    }

    /// The PostgreSQL relay (pool and session counts, for tests and diagnostics); None with
    /// `pgwire.enabled = false`.
    pub fn pg_relay(&self) -> Option<&Arc<RelayState>> {
        self.pg_relay.as_ref()
    }

    /// Device counters of the NIC ports the cores serve on (empty unless `nic.mode = "dpdk"`;
    /// a port whose driver fails the read is left out).
    pub fn nic_ports(&self) -> Vec<NicPortSnapshot> {
        self.nic.iter().filter_map(|n| n.snapshot()).collect()
    }

    /// Whether the origin answers `SELECT 1` on a pooled connection within `timeout` (the
    /// readiness probe); the error says what failed.
    pub async fn probe_origin(&self, timeout: Duration) -> Result<(), String> {
        let probe = async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            client
                .simple_query("SELECT 1")
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, probe)
            .await
            .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
    }

    /// Waits until hits are served (stream up, lag under the bound) or `timeout` passes.
    pub async fn wait_serving(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.shared.serve_hits() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Waits until the applied LSN reaches `lsn`.
    pub async fn wait_applied(&self, lsn: u64, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.applied_lsn() >= lsn {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    // ---- operations ---------------------------------------------------------------------

    /// Drops every cached entry; returns how many (0 when the writer has stopped).
    pub async fn flush_all(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        let _ = self.writer.send(AdminCmd::FlushAll(tx)).await;
        rx.await.unwrap_or(0)
    }

    /// Every cached entry.
    pub async fn dump(&self) -> Vec<crate::writer::DumpedEntry> {
        let (tx, rx) = oneshot::channel();
        let _ = self.writer.send(AdminCmd::Dump(tx)).await;
        rx.await.unwrap_or_default()
    }

    /// Every cached table, by name.
    pub fn tables(&self) -> Vec<TableStatus> {
        let catalog = self.catalog.snapshot();
        let mut out: Vec<TableStatus> = catalog
            .tables
            .values()
            .map(|t| self.table_status(t))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One cached table, by `schema.table` or any of its key prefixes.
    pub fn table(&self, name: &str) -> Option<TableStatus> {
        let catalog = self.catalog.snapshot();
        catalog.find(name).map(|t| self.table_status(t))
    }

    fn table_status(&self, t: &TableInfo) -> TableStatus {
        let state = self.states.get(t.id);
        let primary_key: Vec<String> = t
            .key_columns
            .iter()
            .map(|&c| t.columns[c].name.clone())
            .collect();
        let prefix = t
            .prefixes
            .iter()
            .find(|p| **p == t.name)
            .or(t.prefixes.first())
            .cloned()
            .unwrap_or_else(|| format!("{}.{}", t.schema, t.name));
        let holes: Vec<String> = primary_key.iter().map(|c| format!("{{{c}}}")).collect();
        TableStatus {
            name: format!("{}.{}", t.schema, t.name),
            key_template: format!("{prefix}:{}", holes.join(":")),
            prefixes: t.prefixes.clone(),
            primary_key,
            columns: t.columns.len(),
            enabled: !self.is_disabled(t),
            state,
            entries: self.entry_counts.get(t.id),
        }
    }

    /// Starts caching origin table `name`; with `warm`, fills all its rows in the background
    /// (progress in the table's [`TableState::Warming`]).
    pub async fn add_table(&self, name: &str, warm: bool) -> Result<TableStatus, AdminError> {
        let _serial = self.admin_lock.lock().await;
        let client = self.origin_client().await?;
        let table = catalog::load_named_table(&client, name)
            .await
            .map_err(|e| catalog_error(name, e))?;
        let id = table.id;
        let qualified = format!("{}.{}", table.schema, table.name);
        if self.catalog.get(id).is_some() {
            return Err(AdminError::Conflict(format!(
                "{qualified} is cached already"
            )));
        }
        let publication = self.config_read().replication.publication.clone();
        let origin_err = |e: CatalogError| {
            let detail = match &e {
                CatalogError::Origin(pe) => warm::origin_detail(pe),
                other => other.to_string(),
            };
            AdminError::Origin(format!(
                "adding {qualified} to publication {publication}: {detail}"
            ))
        };
        let listed = catalog::publication_add(&client, &publication, &table)
            .await
            .map_err(origin_err)?;
        // Only what the publication streams can be kept current (a partition whose changes are
        // published as its partitioned table's, say): refuse anything else.
        if !catalog::is_published(&client, &publication, &table)
            .await
            .map_err(origin_err)?
        {
            if listed {
                let _ = catalog::publication_drop(&client, &publication, &table).await;
            }
            return Err(AdminError::BadRequest(format!(
                "{qualified} is not cacheable: publication {publication} does not publish it \
                 under its own name (a partition is read through its partitioned table)"
            )));
        }
        if listed
            && !catalog::wait_for_older_transactions(&client, OLDER_TXN_WAIT)
                .await
                .map_err(origin_err)?
        {
            return Err(AdminError::Conflict(format!(
                "{qualified} joined publication {publication}, but transactions older than that \
                 are still open after {} s; retry once they end",
                OLDER_TXN_WAIT.as_secs()
            )));
        }
        drop(client);
        let epoch = if warm {
            self.states.begin(id)
        } else {
            self.states.clear(id);
            0
        };
        let added = self
            .ask(|tx| AdminCmd::AddTable(Box::new(table), tx))
            .await?;
        if let Err(e) = added {
            self.states.clear(id);
            return Err(AdminError::Conflict(e));
        }
        if self.table_list {
            if let Some(t) = self.catalog.get(id) {
                self.config_write().catalog.tables.push(config_name(&t));
            }
        }
        tracing::info!(table = %qualified, warm, "table added");
        if warm {
            warm::spawn(self, id, epoch);
        }
        let t = self
            .catalog
            .get(id)
            .ok_or_else(|| AdminError::Conflict(format!("{qualified} was removed meanwhile")))?;
        Ok(self.table_status(&t))
    }

    /// Stops caching table `name` (by `schema.table` or key prefix); returns the entries flushed.
    pub async fn remove_table(&self, name: &str) -> Result<u64, AdminError> {
        let _serial = self.admin_lock.lock().await;
        let t = self.find_table(name)?;
        let flushed = self
            .ask(|tx| AdminCmd::RemoveTable(t.id, tx))
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("table {name:?} is not cached")))?;
        self.states.clear(t.id);
        {
            let mut cfg = self.config_write();
            let (plain, quoted) = (format!("{}.{}", t.schema, t.name), config_name(&t));
            cfg.catalog
                .tables
                .retain(|n| *n != plain && *n != quoted && *n != t.name && *n != t.qualified());
        }
        let publication = self.config_read().replication.publication.clone();
        match self.origin_client().await {
            Ok(client) => {
                if let Err(e) = catalog::publication_drop(&client, &publication, &t).await {
                    tracing::warn!(table = %t.name, "leaving it in publication {publication}: {e}");
                }
            }
            Err(e) => {
                tracing::warn!(table = %t.name, "leaving it in publication {publication}: {e}")
            }
        }
        tracing::info!(table = %format!("{}.{}", t.schema, t.name), flushed, "table removed");
        Ok(flushed)
    }

    /// Drops every cached entry of table `name`; returns how many.
    pub async fn flush_table(&self, name: &str) -> Result<u64, AdminError> {
        let t = self.find_table(name)?;
        self.ask(|tx| AdminCmd::FlushTable(t.id, tx)).await
    }

    /// Drops one key's entry; returns 1 if it was cached, else 0.
    pub async fn flush_key(&self, key: &str) -> Result<u64, AdminError> {
        let Some((t, pk)) = self.parse_key(key)? else {
            return Err(AdminError::NotFound(format!(
                "{key:?}: unknown table prefix"
            )));
        };
        let removed = self.ask(|tx| AdminCmd::FlushKey(t.id, pk, tx)).await?;
        Ok(u64::from(removed))
    }

    /// Is `key` cached, since which LSN, how big and how old; if not, why not.
    pub async fn key_info(&self, key: &str) -> Result<KeyInfo, AdminError> {
        let mut info = KeyInfo {
            key: key.to_string(),
            table: None,
            cached: false,
            negative: false,
            lsn: None,
            size_bytes: None,
            age_ms: None,
            reason: None,
        };
        let Some((t, pk)) = self.parse_key(key)? else {
            info.reason = Some("unknown table prefix".into());
            return Ok(info);
        };
        info.table = Some(format!("{}.{}", t.schema, t.name));
        let meta = self
            .ask(|tx| AdminCmd::KeyMeta(t.id, pk.clone(), tx))
            .await?;
        if let Some(entry) = meta.entry {
            info.cached = true;
            info.negative = entry.negative;
            info.lsn = Some(format_lsn(entry.lsn));
            info.size_bytes = Some(entry.bytes as u64);
            info.age_ms = meta.age.map(|a| a.as_millis() as u64);
            if !self.shared.serve_hits() {
                info.reason = Some(
                    "cached, but hits are paused: replication is down or lags past \
                     replication.max_lag_ms, so reads go to the origin"
                        .into(),
                );
            }
            return Ok(info);
        }
        info.reason = Some(self.uncached_reason(&t, &pk, meta.filling));
        Ok(info)
    }

    fn uncached_reason(&self, t: &TableInfo, pk: &[u8], filling: bool) -> String {
        let Some(parts) = t.split_pk(pk) else {
            return format!(
                "the primary key of {} has {} columns: spell the key as {}",
                t.name,
                t.key_columns.len(),
                self.table_status(t).key_template
            );
        };
        let canonical = parts.iter().zip(&t.key_columns).all(|(part, &c)| {
            check_key_text(t.columns[c].type_oid, part) != KeyCheck::NotCanonical
        });
        if !canonical {
            return "not the origin's own spelling of the key value (e.g. 042 for 42): \
                    answered as absent and never cached"
                .into();
        }
        if self.is_disabled(t) {
            return "table disabled (catalog.disabled): reads pass through to the origin".into();
        }
        if filling {
            return "a fill from the origin is in flight".into();
        }
        let warming = matches!(self.states.get(t.id), TableState::Warming { .. });
        if warming {
            return "not cached yet (the table is warming)".into();
        }
        "evicted or never read".into()
    }

    /// The effective config: live values, secrets redacted.
    pub fn effective_config(&self) -> Config {
        redacted(&self.config_read())
    }

    /// Merges `patch` (a partial config, same nested shape) over the effective config, validates
    /// it and applies the live settings ([`LIVE_KEYS`]); any other changed setting answers
    /// [`AdminError::RestartRequired`] and nothing is applied. Returns the new effective config.
    pub fn patch_config(&self, patch: &Value) -> Result<Config, AdminError> {
        let mut cfg = self.config_write();
        let (new, changed) = self.check_patch(&cfg, patch)?;
        let has = |key: &str| changed.iter().any(|k| k == key);
        if has("log.level") {
            self.reload_log(&new.log.level)?;
        }
        if has("catalog.prefixes") || has("catalog.disabled") {
            let sent = self
                .writer
                .try_send(AdminCmd::SetCatalog(new.catalog.clone()));
            if sent.is_err() {
                if has("log.level") {
                    let _ = self.reload_log(&cfg.log.level);
                }
                return Err(AdminError::Conflict(
                    "the store writer is busy; retry".into(),
                ));
            }
        }
        if has("origin.pool_size") {
            self.pool.resize(new.origin.pool_size);
        }
        self.runtime.apply(&new);
        if !changed.is_empty() {
            tracing::info!(keys = %changed.join(","), "config changed at run time");
        }
        *cfg = new;
        Ok(redacted(&cfg))
    }

    /// The patched config and the settings it changes, once everything about it is checked.
    fn check_patch(
        &self,
        cfg: &Config,
        patch: &Value,
    ) -> Result<(Config, Vec<String>), AdminError> {
        let bad = |e: String| AdminError::BadRequest(e);
        let old = serde_json::to_value(cfg).map_err(|e| bad(format!("config: {e}")))?;
        let mut merged = old.clone();
        patch::merge(&mut merged, patch, "").map_err(bad)?;
        let new: Config =
            serde_json::from_value(merged).map_err(|e| bad(format!("config: {e}")))?;
        new.validate().map_err(|e| bad(e.to_string()))?;
        let new_value = serde_json::to_value(&new).map_err(|e| bad(format!("config: {e}")))?;
        let changed = patch::changed_keys(&old, &new_value);
        let restart: Vec<&str> = changed
            .iter()
            .map(String::as_str)
            .filter(|k| !LIVE_KEYS.contains(k))
            .collect();
        if let Some(first) = restart.first() {
            let verb = if restart.len() == 1 { "needs" } else { "need" };
            return Err(AdminError::RestartRequired(format!(
                "{} {verb} a restart ({})",
                restart.join(", "),
                restart_hint(first)
            )));
        }
        let catalog = self.catalog.snapshot();
        if let Some(name) = new
            .catalog
            .disabled
            .iter()
            .find(|n| catalog.find(n).is_none())
        {
            return Err(bad(format!(
                "catalog.disabled: {name:?} is not a cached table"
            )));
        }
        if changed.iter().any(|k| k == "log.level") && self.log_reload_missing() {
            return Err(AdminError::RestartRequired(
                "log.level needs a restart (this process has no live log filter)".into(),
            ));
        }
        Ok((new, changed))
    }

    fn log_reload_missing(&self) -> bool {
        self.log_reload
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn reload_log(&self, level: &str) -> Result<(), AdminError> {
        let reload = self.log_reload.read().unwrap_or_else(|e| e.into_inner());
        match reload.as_ref() {
            Some(f) => f(level).map_err(|e| AdminError::BadRequest(format!("log.level: {e}"))),
            None => Err(AdminError::RestartRequired(
                "log.level needs a restart (this process has no live log filter)".into(),
            )),
        }
    }

    /// Installs the function that replaces the log filter (`log.level` then changes live).
    pub fn set_log_reload(&self, f: LogReload) {
        *self.log_reload.write().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// The store's counters (each read atomically; not one consistent snapshot).
    pub fn store_stats(&self) -> StoreStats {
        self.shared.store().stats()
    }

    /// The origin pool's size and use.
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    // ---- helpers ------------------------------------------------------------------------

    /// Sends a command to the store writer and waits for its answer.
    pub(crate) async fn ask<T>(
        &self,
        cmd: impl FnOnce(oneshot::Sender<T>) -> AdminCmd,
    ) -> Result<T, AdminError> {
        let (tx, rx) = oneshot::channel();
        let gone = || AdminError::Conflict("pgline is shutting down".into());
        self.writer.send(cmd(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    async fn origin_client(&self) -> Result<deadpool_postgres::Client, AdminError> {
        self.pool
            .get()
            .await
            .map_err(|e| AdminError::Origin(e.to_string()))
    }

    fn find_table(&self, name: &str) -> Result<Arc<TableInfo>, AdminError> {
        self.catalog
            .snapshot()
            .find(name)
            .cloned()
            .ok_or_else(|| AdminError::NotFound(format!("table {name:?} is not cached")))
    }

    /// Splits a key with the cores' own key space; `None` for an unknown prefix.
    fn parse_key(&self, key: &str) -> Result<Option<ParsedKey>, AdminError> {
        if !key.contains(':') {
            return Err(AdminError::BadRequest(format!(
                "{key:?} is not a key: keys are <table>:<primary key>, e.g. users:42"
            )));
        }
        let space = self.shared.keyspace().snapshot();
        let Some((id, pk)) = space.resolve(key.as_bytes()) else {
            return Ok(None);
        };
        Ok(self.catalog.get(id).map(|t| (t, pk.into())))
    }

    /// Whether `catalog.disabled` names table `t` (by any of the names `find` accepts).
    fn is_disabled(&self, t: &TableInfo) -> bool {
        let cfg = self.config_read();
        if cfg.catalog.disabled.is_empty() {
            return false;
        }
        let qualified = format!("{}.{}", t.schema, t.name);
        cfg.catalog
            .disabled
            .iter()
            .any(|n| *n == qualified || t.prefixes.iter().any(|p| p == n))
    }

    /// The effective config, secrets included (for the node's own views, never to send out).
    pub(crate) fn config_read(&self) -> std::sync::RwLockReadGuard<'_, Config> {
        self.cfg.read().unwrap_or_else(|e| e.into_inner())
    }

    fn config_write(&self) -> std::sync::RwLockWriteGuard<'_, Config> {
        self.cfg.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A copy of `cfg` with every secret replaced (see [`patch::redact`]).
fn redacted(cfg: &Config) -> Config {
    let mut safe = cfg.clone();
    safe.origin.url = patch::redact_conn_string(&safe.origin.url);
    if !safe.resp.password.is_empty() {
        safe.resp.password = patch::REDACTED.into();
    }
    // Through JSON as well, so secrets of sections this function does not name are caught.
    serde_json::to_value(&safe)
        .ok()
        .and_then(|mut v| {
            patch::redact(&mut v);
            serde_json::from_value(v).ok()
        })
        .unwrap_or(safe)
}

/// How `catalog.tables` spells a table: `schema.name`, quoting only names that need it.
fn config_name(t: &TableInfo) -> String {
    let plain = |s: &str| {
        s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let part = |s: &str| {
        if plain(s) {
            s.to_string()
        } else {
            catalog::quote_ident(s)
        }
    };
    format!("{}.{}", part(&t.schema), part(&t.name))
}

fn catalog_error(name: &str, e: CatalogError) -> AdminError {
    match e {
        CatalogError::NoSuchTable(_) => {
            AdminError::NotFound(format!("no table {name:?} on the origin"))
        }
        CatalogError::NoPrimaryKey(t) => {
            AdminError::BadRequest(format!("{t} has no primary key, so its rows have no key"))
        }
        CatalogError::NotCacheable { name, reason } => {
            AdminError::BadRequest(format!("{name} is not cacheable: {reason}"))
        }
        CatalogError::Origin(e) => match e.as_db_error() {
            // A name the origin cannot parse (`a.b.c.d`, bad quoting): the caller's mistake.
            Some(db) if db.code().code().starts_with("3F") => {
                AdminError::NotFound(format!("table {name:?}: {}", db.message()))
            }
            Some(db)
                if db.code().code().starts_with("42") || db.code().code().starts_with("0A") =>
            {
                AdminError::BadRequest(format!("table name {name:?}: {}", db.message()))
            }
            _ => AdminError::Origin(warm::origin_detail(&e)),
        },
    }
}
