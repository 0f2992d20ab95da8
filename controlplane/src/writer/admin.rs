//! The writer's side of the admin API: flushes, key metadata, adding, removing and warming
//! tables, live key prefixes.
//!
//! Every command runs inside the writer's loop, so it is ordered with fills and WAL changes like
//! everything else that touches the store. Warming uses the miss path's leases: a batch of keys
//! is leased before its origin read, any WAL change to one of them voids its lease, and only a
//! live lease installs (see the parent module), so a write during warming never leaves a stale
//! entry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgline_dataplane::row::SECTION_RESP_JSON;
use pgline_dataplane::store::{EntryMeta, Lookup};
use tokio::sync::oneshot;

use super::{bulk_payload, DumpedEntry, Fill, FillKey, Writer};
use crate::catalog::TableInfo;
use crate::config::CatalogConfig;

/// Requests from the API and tests to the writer.
pub enum AdminCmd {
    FlushAll(oneshot::Sender<u64>),
    FlushTable(u32, oneshot::Sender<u64>),
    FlushKey(u32, Box<[u8]>, oneshot::Sender<bool>),
    /// Every cached entry.
    Dump(oneshot::Sender<Vec<DumpedEntry>>),
    /// What the writer knows about one key.
    KeyMeta(u32, Box<[u8]>, oneshot::Sender<KeyMeta>),
    /// Starts caching a table read from the origin; `Err` if it is cached already.
    AddTable(Box<TableInfo>, oneshot::Sender<Result<(), String>>),
    /// Stops caching a table: entries dropped, leases voided. `None` if it was not cached.
    RemoveTable(u32, oneshot::Sender<Option<u64>>),
    /// Fills these keys of a table through leases; answers once their fill has landed with the
    /// keys whose lease a WAL change voided (not installed: worth another try), or the origin's
    /// error.
    Warm(
        u32,
        Vec<Box<[u8]>>,
        oneshot::Sender<Result<Vec<Box<[u8]>>, String>>,
    ),
    /// New `catalog.prefixes` and `catalog.disabled` (its `tables` is ignored): prefixes
    /// re-derived, newly disabled tables flushed, key space republished.
    SetCatalog(CatalogConfig),
}

/// Entries per table as the store writer counts them (it keeps the count as entries come and
/// go), copied here every [`COUNT_INTERVAL`] for the API.
#[derive(Debug, Default)]
pub struct EntryCounts {
    counts: Mutex<Option<HashMap<u32, u64>>>,
}

pub const COUNT_INTERVAL: Duration = Duration::from_secs(2);

impl EntryCounts {
    /// Entries of table `id` at the last copy; `None` before the first.
    pub fn get(&self, id: u32) -> Option<u64> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.as_ref().map(|c| c.get(&id).copied().unwrap_or(0))
    }

    fn set(&self, counts: Option<HashMap<u32, u64>>) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = counts;
    }
}

/// The answer to a warming batch: the keys whose lease a WAL change voided, or the origin's
/// error.
pub type WarmDone = oneshot::Sender<Result<Vec<Box<[u8]>>, String>>;

/// One key as the writer sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyMeta {
    /// The store's entry, if it is cached.
    pub entry: Option<EntryMeta>,
    /// Time since the writer installed the entry's current version.
    pub age: Option<Duration>,
    /// A fill for the key is in flight.
    pub filling: bool,
}

impl Writer {
    pub(super) fn admin(&mut self, cmd: AdminCmd) {
        if matches!(
            cmd,
            AdminCmd::FlushAll(_)
                | AdminCmd::FlushTable(..)
                | AdminCmd::FlushKey(..)
                | AdminCmd::RemoveTable(..)
        ) {
            // Core reads held or in flight now land after the flush (`install_core_read`).
            self.flushed_at = Some(Instant::now());
        }
        match cmd {
            AdminCmd::FlushAll(tx) => {
                let n = self.store.stats().entries;
                self.flush_all();
                let _ = tx.send(n);
            }
            AdminCmd::FlushTable(t, tx) => {
                let _ = tx.send(self.drop_table(t));
            }
            AdminCmd::FlushKey(t, pk, tx) => {
                self.void(t, &pk);
                let _ = tx.send(self.uninstall(t, &pk));
            }
            AdminCmd::Dump(tx) => {
                let _ = tx.send(self.dump());
            }
            AdminCmd::KeyMeta(t, pk, tx) => {
                let entry = self.store.meta(t, &pk);
                let key = (t, pk);
                let age = entry.and(self.installed.get(&key)).map(|at| at.elapsed());
                let filling = self.inflight.contains_key(&key);
                let _ = tx.send(KeyMeta {
                    entry,
                    age,
                    filling,
                });
            }
            AdminCmd::AddTable(table, tx) => {
                let _ = tx.send(self.add_table(*table));
            }
            AdminCmd::RemoveTable(t, tx) => {
                let _ = tx.send(self.remove_table(t));
            }
            AdminCmd::Warm(t, pks, tx) => self.warm(t, pks, tx),
            AdminCmd::SetCatalog(cfg) => {
                self.cfg.catalog.prefixes = cfg.prefixes;
                self.cfg.catalog.disabled = cfg.disabled;
                self.catalog.reassign_prefixes(&self.cfg.catalog);
                self.publish_catalog();
            }
        }
    }

    /// Copies the store's entries per table if [`COUNT_INTERVAL`] has passed (one step per
    /// table: the store keeps the counts; walking it instead blocked the writer for about 200 ms
    /// per 850,000 entries, `bench/miss-stall.sh`).
    pub(super) fn count_entries(&mut self, now: Instant) {
        if now.duration_since(self.counted_at) < COUNT_INTERVAL {
            return;
        }
        self.counted_at = now;
        self.entry_counts
            .set(Some(self.store.entries_by_table().collect()));
    }

    fn dump(&self) -> Vec<DumpedEntry> {
        let mut keys = Vec::new();
        self.store
            .for_each_key(|t, pk, meta| keys.push((t, pk.to_vec(), meta.negative)));
        let reader = self.store.reader();
        let mut out = Vec::with_capacity(keys.len());
        for (t, pk, negative) in keys {
            if negative {
                out.push(DumpedEntry {
                    table: t,
                    pk,
                    json: None,
                });
                continue;
            }
            let mut bulk = Vec::new();
            if reader.read(t, &pk, SECTION_RESP_JSON, &mut bulk) == Lookup::Hit {
                let json = Some(bulk_payload(&bulk).to_vec());
                out.push(DumpedEntry { table: t, pk, json });
            }
        }
        out
    }

    fn add_table(&mut self, table: TableInfo) -> Result<(), String> {
        let id = table.id;
        if self.catalog.get(id).is_some() {
            return Err(format!("{}.{} is cached already", table.schema, table.name));
        }
        // Nothing of it can be in the store (it was flushed when removed, and nothing installs
        // for a table outside the catalog), but its WAL changes were ignored until now: be sure.
        self.drop_table(id);
        self.excluded.remove(&id);
        self.catalog.insert(table, &self.cfg.catalog);
        self.publish_catalog();
        Ok(())
    }

    fn remove_table(&mut self, id: u32) -> Option<u64> {
        if !self.catalog.remove(id, &self.cfg.catalog) {
            return None;
        }
        self.excluded.insert(id);
        // Cores stop resolving its keys first; misses already queued answer "absent".
        self.publish_catalog();
        Some(self.drop_table(id))
    }

    /// Leases and fills the keys of one warming batch that are neither cached nor being filled.
    fn warm(&mut self, t: u32, pks: Vec<Box<[u8]>>, tx: WarmDone) {
        let Some(table) = self.catalog.get(t).cloned() else {
            let _ = tx.send(Err("the table is no longer cached".into()));
            return;
        };
        if self.disabled.contains(&t) {
            let _ = tx.send(Err("the table is disabled (catalog.disabled)".into()));
            return;
        }
        let fid = self.next_id;
        self.next_id += 1;
        let mut keys = Vec::new();
        for pk in pks {
            let key = (t, pk);
            if self.store.meta(t, &key.1).is_some() || self.inflight.contains_key(&key) {
                continue;
            }
            // The lease, taken before the origin read starts (as for a miss).
            self.inflight.insert(key.clone(), (fid, keys.len()));
            keys.push(FillKey {
                pk: key.1,
                install: true,
                waiters: Vec::new(),
            });
        }
        if keys.is_empty() {
            let _ = tx.send(Ok(Vec::new()));
            return;
        }
        self.fills.insert(
            fid,
            Fill {
                table,
                keys,
                on_done: Some(tx),
                created: Instant::now(),
                of_misses: false,
            },
        );
        self.start_fill(fid);
    }
}
