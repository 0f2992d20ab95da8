//! The writer's part of the query-result cache: installing landed answers only when current,
//! and dropping them when the WAL changes a table they read.
//!
//! Answers live in the store under [`RESULTS_TABLE`] (`u32::MAX - 1`, an id no cached table
//! has in practice: see `plane::RESULTS_TABLE`), keyed by the 8 bytes of the key's hash; the
//! entry's one section is `key length (u32) | key | RowDescription DataRow* CommandComplete`.
//!
//! # Installing (the fill race, as for rows)
//! The relay takes a lease (per-table epochs, `crate::result_plane::ResultPlane`) before the statement
//! reaches the origin and runs `pg_current_snapshot()` right before it on the same backend
//! (under READ COMMITTED the statement's snapshot is later, so it sees at least as much). An
//! answer is installed only if
//! 1. no WAL change of a table it read was applied since the lease (epochs unchanged), and
//! 2. its snapshot sees every transaction the writer applied to those tables that is not yet
//!    known to be visible to every later snapshot (the commit-visibility gap of
//!    `docs/consistency.md`: a change applied before the lease may still be invisible).
//!
//! A change committed before the snapshot is in the answer; one applied after the lease voids
//! it (1); one applied before the lease but invisible to the snapshot is refused by (2). Per
//! table a set of xids is kept, not just the last one: changes of different rows hold no
//! common lock, so their visibility order need not follow their commit order. The sets are
//! pruned like the per-key records (`visibility.rs`): a checked snapshot's xmin M, once every
//! lease taken before that check has ended, lets xids below M go. Past [`MAX_XIDS`] for a
//! table (writes and no landed answers), its set collapses into a watermark: answers of that
//! table then need a snapshot whose xmin is past the watermark, until pruning drops it.
//!
//! # Invalidation
//! A WAL change (insert, update, delete, truncate, relation change) of table T drops every
//! answer that reads T, except an answer with a top-level equality `T.c = v`: it is dropped
//! only if the changed row's new or old value of `c` is `v`, or that value is unknown (an
//! unchanged TOASTed value; the old value of a non-key column unless the table has
//! `REPLICA IDENTITY FULL`), in which case every answer with an equality on `T.c` goes.
//!
//! # Bounds
//! The index holds at most `store budget / 1 KiB` answers (at least 1024). When full, the
//! entries the store evicted are forgotten; if it is still full, new answers are not installed.
//! Evicted store entries leave their index entries behind until then: harmless, as dropping
//! an answer that is no longer there does nothing.
//!
//! Thread model: owned by the writer task.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::result_plane::{ResultFill, ResultPlane};
use pgline_dataplane::plane::{ResultEquality, RESULTS_TABLE};
use pgline_dataplane::store::{EntryData, StoreWriter};

use crate::catalog::TableInfo;
use crate::fill::{parse_snapshot, xid_precedes};
use crate::wal::{Change, TupleValue};

/// Applied xids kept per table before that table's answers are refused until pruning.
const MAX_XIDS: usize = 65_536;
/// Pending horizons kept (older ones dropped: pruning only gets later, never unsound).
const MAX_HORIZONS: usize = 1024;

type Hash = u64;
/// Answers by the value of one column: `(table, column) -> value -> answers`.
type ByValue = HashMap<(u32, u16), HashMap<Box<[u8]>, HashSet<Hash>>>;

struct Entry {
    tables: Box<[u32]>,
    /// The equality the answer is indexed under, per table (`None`: by table).
    eqs: Box<[ResultEquality]>,
}

/// Counters for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResultCounts {
    pub installed: u64,
    pub refused: u64,
    pub dropped: u64,
}

#[derive(Default)]
pub struct Results {
    entries: HashMap<Hash, Entry>,
    by_table: HashMap<u32, HashSet<Hash>>,
    by_value: ByValue,
    xids: HashMap<u32, Vec<u32>>,
    /// Per table, when its xids overflowed: the latest of them; a snapshot must have every
    /// xid up to it completed (`xmin` after it).
    watermark: HashMap<u32, u32>,
    horizons: VecDeque<(u32, u64)>,
    /// Replica identity of each relation the WAL described (`d`, `f`, `i`, `n`).
    identity: HashMap<u32, u8>,
    pub counts: ResultCounts,
}

impl Results {
    /// Installs a landed answer if it is current; returns whether it was installed.
    pub fn install(
        &mut self,
        store: &mut StoreWriter,
        plane: &ResultPlane,
        fill: ResultFill,
        lsn: u64,
    ) -> bool {
        let ok = self.try_install(store, plane, &fill, lsn);
        if ok {
            self.counts.installed += 1;
        } else {
            self.counts.refused += 1;
        }
        ok
    }

    fn try_install(
        &mut self,
        store: &mut StoreWriter,
        plane: &ResultPlane,
        fill: &ResultFill,
        lsn: u64,
    ) -> bool {
        let Some(snap) = parse_snapshot(&fill.snapshot) else {
            return false;
        };
        if self.horizons.len() == MAX_HORIZONS {
            self.horizons.pop_front();
        }
        self.horizons.push_back((snap.xmin, plane.next_id()));
        if !plane.unchanged(&fill.lease) {
            return false;
        }
        let key = &fill.key;
        let current = key.tables.iter().all(|t| {
            let xids = self.xids.get(t).map_or(&[][..], |v| &v[..]);
            let above = self
                .watermark
                .get(t)
                .is_none_or(|&w| xid_precedes(w, snap.xmin));
            above && xids.iter().all(|&x| snap.sees(x))
        });
        if !current {
            return false;
        }
        let cap = (store.stats().budget_bytes as usize / 1024).max(1024);
        if self.entries.len() >= cap && !self.entries.contains_key(&key.hash) {
            self.entries
                .retain(|h, _| store.meta(RESULTS_TABLE, &h.to_be_bytes()).is_some());
            if self.entries.len() >= cap {
                return false;
            }
        }
        self.drop_result(store, key.hash);
        let mut section = Vec::with_capacity(4 + key.key.len() + fill.bytes.len());
        section.extend_from_slice(&(key.key.len() as u32).to_be_bytes());
        section.extend_from_slice(&key.key);
        section.extend_from_slice(&fill.bytes);
        let sections: [&[u8]; 1] = [&section];
        let entry = EntryData {
            sections: &sections,
            negative: false,
            lsn,
        };
        if store
            .insert(RESULTS_TABLE, &key.store_key(), &entry)
            .is_err()
        {
            return false;
        }
        let mut eqs = Vec::new();
        for &t in key.tables.iter() {
            match key.equalities.iter().find(|e| e.0 == t) {
                Some((_, col, v)) => {
                    self.by_value
                        .entry((t, *col))
                        .or_default()
                        .entry(v.clone())
                        .or_default()
                        .insert(key.hash);
                    eqs.push((t, *col, v.clone()));
                }
                None => {
                    self.by_table.entry(t).or_default().insert(key.hash);
                }
            }
        }
        self.entries.insert(
            key.hash,
            Entry {
                tables: key.tables.clone(),
                eqs: eqs.into(),
            },
        );
        true
    }

    /// Forgets an answer and removes it from the store.
    fn drop_result(&mut self, store: &mut StoreWriter, hash: Hash) {
        let Some(e) = self.entries.remove(&hash) else {
            return;
        };
        for t in e.tables.iter() {
            match e.eqs.iter().find(|x| x.0 == *t) {
                Some((_, col, v)) => {
                    if let Some(m) = self.by_value.get_mut(&(*t, *col)) {
                        if let Some(set) = m.get_mut(v) {
                            set.remove(&hash);
                            if set.is_empty() {
                                m.remove(v);
                            }
                        }
                    }
                }
                None => {
                    if let Some(set) = self.by_table.get_mut(t) {
                        set.remove(&hash);
                    }
                }
            }
        }
        store.remove(RESULTS_TABLE, &hash.to_be_bytes());
        self.counts.dropped += 1;
    }

    fn drop_all(&mut self, store: &mut StoreWriter, hashes: impl IntoIterator<Item = Hash>) {
        for h in hashes {
            self.drop_result(store, h);
        }
    }

    /// Records an applied change of `table` by transaction `xid` (0: outside a transaction).
    fn applied(&mut self, plane: &ResultPlane, table: u32, xid: u32) {
        plane.bump(table);
        if xid != 0 {
            let v = self.xids.entry(table).or_default();
            if v.last() != Some(&xid) {
                v.push(xid);
            }
            if v.len() > MAX_XIDS {
                // Bounded: collapse into a watermark (stricter, still sound).
                let latest = v
                    .iter()
                    .copied()
                    .fold(xid, |a, x| if xid_precedes(a, x) { x } else { a });
                v.clear();
                let w = self.watermark.entry(table).or_insert(latest);
                if xid_precedes(*w, latest) {
                    *w = latest;
                }
            }
        }
    }

    /// Every answer reading `table` goes (truncate, relation change, DROP, flush of the table).
    pub fn table_changed(
        &mut self,
        store: &mut StoreWriter,
        plane: &ResultPlane,
        table: u32,
        xid: u32,
    ) {
        self.applied(plane, table, xid);
        let mut gone: Vec<Hash> = self
            .by_table
            .remove(&table)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        let cols: Vec<(u32, u16)> = self
            .by_value
            .keys()
            .filter(|k| k.0 == table)
            .copied()
            .collect();
        for k in cols {
            if let Some(m) = self.by_value.remove(&k) {
                gone.extend(m.into_values().flatten());
            }
        }
        self.drop_all(store, gone);
    }

    /// A row change of the WAL (`Relation` only records the replica identity).
    pub fn row_changed(
        &mut self,
        store: &mut StoreWriter,
        plane: &ResultPlane,
        change: &Change,
        table: Option<&TableInfo>,
        xid: u32,
    ) {
        let (rel, old, new, update) = match change {
            Change::Relation(r) => {
                self.identity.insert(r.id, r.replica_identity);
                return;
            }
            Change::Insert { rel, new } => (*rel, None, Some(new), false),
            Change::Update { rel, old_key, new } => (*rel, old_key.as_ref(), Some(new), true),
            Change::Delete { rel, old_key } => (*rel, Some(old_key), None, false),
            Change::Truncate { .. } | Change::Invalidate { .. } => return,
        };
        if rel == RESULTS_TABLE {
            return;
        }
        self.applied(plane, rel, xid);
        let gone: Vec<Hash> = self
            .by_table
            .remove(&rel)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        self.drop_all(store, gone);
        let cols: Vec<u16> = self
            .by_value
            .keys()
            .filter(|k| k.0 == rel)
            .map(|k| k.1)
            .collect();
        let identity = self.identity.get(&rel).copied().unwrap_or(b'n');
        for col in cols {
            let c = usize::from(col);
            let is_key = identity == b'd' && table.is_some_and(|t| t.key_columns.contains(&c));
            let mut values: Vec<Option<&[u8]>> = Vec::new();
            let mut unknown = false;
            if let Some(new) = new {
                match new.get(c) {
                    Some(TupleValue::Text(b)) => values.push(Some(b)),
                    Some(TupleValue::Null) => {}
                    _ => unknown = true,
                }
            }
            let old_known = identity == b'f' || is_key;
            match (old, update) {
                (Some(old), _) if old_known => match old.get(c) {
                    Some(TupleValue::Text(b)) => values.push(Some(b)),
                    Some(TupleValue::Null) => {}
                    _ => unknown = true,
                },
                // An update without an old tuple kept its key: the new key value is the old.
                (None, true) if is_key => {}
                (None, false) => {}
                _ => unknown = true,
            }
            let Some(m) = self.by_value.get_mut(&(rel, col)) else {
                continue;
            };
            let gone: Vec<Hash> = if unknown {
                self.by_value
                    .remove(&(rel, col))
                    .map(|m| m.into_values().flatten().collect())
                    .unwrap_or_default()
            } else {
                values
                    .into_iter()
                    .flatten()
                    .filter_map(|v| m.remove(v))
                    .flatten()
                    .collect()
            };
            self.drop_all(store, gone);
        }
    }

    /// Every stored answer goes and every lease is voided, the row cache stays: the origin's
    /// schema or role names changed, and an answer may have read a name resolved under them.
    pub fn drop_every_answer(&mut self, store: &mut StoreWriter, plane: &ResultPlane) {
        plane.bump_all();
        let all: Vec<Hash> = self.entries.keys().copied().collect();
        self.drop_all(store, all);
    }

    /// The cache was flushed whole (slot re-created): forget everything, void every lease.
    pub fn clear(&mut self, plane: &ResultPlane) {
        plane.bump_all();
        self.entries.clear();
        self.by_table.clear();
        self.by_value.clear();
    }

    /// Drops applied xids every answer still to land is known to see.
    pub fn prune(&mut self, plane: &ResultPlane) {
        let oldest = plane.oldest_outstanding();
        let mut floor = None;
        while let Some(&(xmin, next_id)) = self.horizons.front() {
            if next_id > oldest {
                break;
            }
            floor = Some(xmin);
            self.horizons.pop_front();
        }
        if let Some(m) = floor {
            for v in self.xids.values_mut() {
                v.retain(|x| !xid_precedes(*x, m));
            }
            self.xids.retain(|_, v| !v.is_empty());
            self.watermark.retain(|_, w| !xid_precedes(*w, m));
        }
    }
}

impl super::Writer {
    /// Installs (or refuses) the query results the relay handed over.
    pub(super) fn take_results(&mut self) {
        let lsn = self
            .repl
            .applied_lsn
            .load(std::sync::atomic::Ordering::Relaxed);
        for fill in self.leases.drain() {
            let ok = self
                .results
                .install(&mut self.store, &self.leases, fill, lsn);
            tracing::debug!(installed = ok, "pgwire: query result landed");
        }
    }

    /// Installed/refused/dropped query results so far.
    pub fn result_counts(&self) -> ResultCounts {
        self.results.counts
    }
}

/// The relation a change is about (0 for a truncate or an invalidation: their tables go
/// through `drop_table`).
pub(super) fn change_rel(change: &Change) -> u32 {
    match change {
        Change::Relation(r) => r.id,
        Change::Insert { rel, .. } | Change::Update { rel, .. } | Change::Delete { rel, .. } => {
            *rel
        }
        Change::Truncate { .. } | Change::Invalidate { .. } => 0,
    }
}

#[cfg(test)]
#[path = "results_tests.rs"]
mod tests;
