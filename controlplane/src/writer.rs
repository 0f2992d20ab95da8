//! The store's single writer: misses in, fills out, WAL changes applied, in one order.
//!
//! Everything that changes the store goes through this one task, so "which happened first, the
//! fill or the write?" always has an answer. The fill race (DESIGN.md, "Coherence") is closed
//! with leases:
//!
//! 1. A miss for key K with no fill in flight creates a lease: `inflight[K] = (fill, slot)`,
//!    *before* the fill's origin read is started.
//! 2. Any WAL change that touches K (insert, update of either its old or new key, delete,
//!    truncate or relation change of its table) removes `inflight[K]`: the lease is void.
//! 3. When the fill lands, it is installed only if `inflight[K]` still names it.
//!
//! A change that commits after the fill's read began is applied after step 1 (it is decoded from
//! the WAL only after it commits), so it voids the lease and the possibly older read is never
//! installed; its waiters still get the value read, which was current at a moment after their
//! request arrived. A change applied before step 1 committed before the read began, so the read
//! sees it. See `docs/consistency.md` for the proof sketch.
//!
//! Hits of cached keys are refreshed in place from the WAL tuple (so hit ratio survives writes);
//! an UPDATE whose new tuple lacks an unchanged TOASTed column evicts instead; DELETE turns a
//! cached row into a negative entry; INSERT refreshes a negative entry.
//!
//! Query results of the PostgreSQL front are installed (only when current) and dropped by the
//! WAL changes of the tables they read here too, in the same order: see [`results`].
//!
//! Admin commands (flushes, key metadata, adding/removing/warming tables) are handled in
//! [`admin`]; warming goes through the same leases as misses, so it cannot install a stale row.
//! Besides the store, the writer keeps each live key's install time (`installed`, for the API's
//! "age"); it is pruned of evicted keys when it grows past twice the store's entry count.

mod admin;
mod ahead;
mod ddl;
mod results;
mod visibility;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_dataplane::plane::{
    ConnToken, ControlPort, FillResult, Invalidation, MissReply, Replication,
};
use pgline_dataplane::row::{SECTION_COLUMNS, SECTION_RESP_JSON};
use pgline_dataplane::store::{EntryData, Lookup, StoreWriter};
use tokio::sync::{mpsc, Notify};

use crate::catalog::{Catalog, CatalogCell, TableInfo};
use crate::config::{Config, Runtime};
use crate::fill::AppliedXids;
use crate::fill::{self, encode_row, Fetched, FetchedBatch, FillError, Snapshot};
use crate::result_plane::ResultPlane;
use crate::wal::{Change, ReplicationState, TupleValue, WalEvent, WalTxn};

type Key = (u32, Box<[u8]>);

pub use admin::{AdminCmd, EntryCounts, KeyMeta, WarmDone};
pub use results::ResultCounts;

/// A PostgreSQL lookup's read made on a core (`crate::corefill`), offered for the store. The
/// writer installs it only if it is current by the writer's own rule and its snapshot is not
/// older than what pruning forgot ([`Writer::install_core_read`]).
#[derive(Debug)]
pub struct CoreRead {
    pub table: u32,
    pub pk: Box<[u8]>,
    /// The row, or `None`: no such row.
    pub row: Option<Arc<pgline_dataplane::plane::RowBytes>>,
    /// The statement snapshot it was read under.
    pub snapshot: Arc<Snapshot>,
    /// When the read's statement was sent: a flush the writer took after it refuses the read.
    pub asked: Instant,
    /// The origin's WAL position after the read (the fill statement's).
    pub lsn: u64,
}

/// Core reads waiting for the writer; past this they are dropped (a later miss reads again).
pub const CORE_READS_QUEUED: usize = 4096;

/// One cached entry, as the stale probe and the API see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedEntry {
    pub table: u32,
    pub pk: Vec<u8>,
    /// The row's JSON, or `None` for a negative entry (the row does not exist).
    pub json: Option<Vec<u8>>,
}

struct FillKey {
    pk: Box<[u8]>,
    /// Holds a lease: install the result if it is still live when the fill lands.
    install: bool,
    waiters: Vec<(u64, usize)>,
}

struct Fill {
    table: Arc<TableInfo>,
    keys: Vec<FillKey>,
    /// A warming batch: told which keys lost their lease to a WAL change (so were not
    /// installed), or the origin's error.
    on_done: Option<admin::WarmDone>,
    /// When the first key joined it: its origin read ends within `origin.query_timeout_ms` of
    /// this, time spent queued included.
    created: Instant,
    /// A fill of misses, counted in [`Writer::running`] once started.
    of_misses: bool,
}

/// Fills of misses in flight at once; further misses queue and join one statement
/// (`docs/decisions.md`, "Misses of many sessions share a fill statement").
const FILLS_IN_FLIGHT: usize = 2;

struct FillDone {
    fill: u64,
    result: Result<FetchedBatch, FillError>,
}

struct Waiting {
    core: usize,
    conn: ConnToken,
    seq: u64,
    results: Vec<Option<FillResult>>,
    remaining: usize,
    /// [`MissRequest::current_only`](pgline_dataplane::plane::MissRequest): a read not known
    /// current is answered as an error (the PostgreSQL front then forwards the statement).
    current_only: bool,
    /// The highest origin WAL position of the reads that answered it so far (see
    /// [`MissReply::lsn`]).
    lsn: u64,
}

/// What a PostgreSQL point lookup's miss is told when the read cannot answer it: the core
/// forwards the statement to the origin instead.
const NOT_CURRENT: &str = "the fill's read is not known current: ask the origin";

pub struct Writer {
    cfg: Config,
    store: StoreWriter,
    /// The writer's side of the plane: misses in, fill replies out, gauges published.
    plane: ControlPort,
    /// The query-result cache's leases and landed answers (shared with the relay).
    leases: Arc<ResultPlane>,
    catalog: Catalog,
    pool: deadpool_postgres::Pool,
    repl: Arc<ReplicationState>,
    inflight: HashMap<Key, (u64, usize)>,
    fills: HashMap<u64, Fill>,
    /// Fills of misses not started yet, oldest first: they start as running ones land.
    queued: std::collections::VecDeque<u64>,
    /// The queued fill that takes further misses, per (table, installs).
    open: HashMap<(u32, bool), u64>,
    /// Fills of misses started and not landed ([`FILLS_IN_FLIGHT`] at most).
    running: usize,
    waiting: HashMap<u64, Waiting>,
    next_id: u64,
    fill_tx: mpsc::UnboundedSender<FillDone>,
    fill_rx: mpsc::UnboundedReceiver<FillDone>,
    /// Whether the catalog caches every table with a primary key (new tables join on sight).
    all_tables: bool,
    runtime: Arc<Runtime>,
    catalog_cell: Arc<CatalogCell>,
    /// Install time of each key the writer put in the store (see the module doc).
    installed: HashMap<Key, Instant>,
    /// When keys were last flushed (by an operator: all, a table, a key, a removed table; or
    /// by the slot's re-creation): core reads asked before it are not installed, whichever keys
    /// they carry.
    flushed_at: Option<Instant>,
    /// Rows installed from reads ahead of the applied WAL (see [`ahead`]).
    ahead: ahead::Ahead,
    /// Tables removed by the API: they do not rejoin on sight in every-table mode.
    excluded: HashSet<u32>,
    /// Tables named in `catalog.disabled`: misses read the origin and install nothing.
    disabled: HashSet<u32>,
    entry_counts: Arc<EntryCounts>,
    counted_at: Instant,
    /// The catalog check for DROP/RENAME, which the WAL does not show (see [`ddl`]).
    ddl: ddl::DdlCheck,
    /// Commit visibility (see the module doc): the xid of the last applied WAL change of each
    /// key, and of each table's last truncate or relation change, kept until every later fill
    /// snapshot is known to see it.
    seen: visibility::Applied,
    /// The xid of the WAL transaction being applied (0 outside `apply_txn`).
    applying_xid: u32,
    /// The query-result cache's index and install checks (see [`results`]).
    results: results::Results,
    /// Reads made on the cores, offered for the store (see [`CoreRead`]).
    core_reads: mpsc::Receiver<CoreRead>,
    /// Every xid applied, for the check of the cores' own reads (`crate::corefill`).
    applied_xids: Arc<AppliedXids>,
    /// Client-tracking invalidations of the changes made since the last event: sent to the
    /// cores once the event's changes are all in the store (issue 18).
    invalidations: Vec<Invalidation>,
}

/// What the writer needs besides the store and the catalog.
pub struct WriterParts {
    pub cfg: Config,
    pub plane: ControlPort,
    pub leases: Arc<ResultPlane>,
    pub pool: deadpool_postgres::Pool,
    pub repl: Arc<ReplicationState>,
    pub runtime: Arc<Runtime>,
    pub catalog_cell: Arc<CatalogCell>,
    pub entry_counts: Arc<EntryCounts>,
    pub core_reads: mpsc::Receiver<CoreRead>,
    /// What the cores' own fill reads are checked against (`crate::corefill`).
    pub applied_xids: Arc<AppliedXids>,
}

impl Writer {
    pub fn new(store: StoreWriter, catalog: Catalog, parts: WriterParts) -> Writer {
        let WriterParts {
            cfg,
            plane,
            leases,
            pool,
            repl,
            runtime,
            catalog_cell,
            entry_counts,
            core_reads,
            applied_xids,
        } = parts;
        let (fill_tx, fill_rx) = mpsc::unbounded_channel();
        let all_tables = cfg.catalog.tables.is_empty();
        let cache_users = cfg.pg_cache_users();
        Writer {
            cfg,
            store,
            plane,
            leases,
            catalog,
            pool,
            repl,
            runtime,
            catalog_cell,
            installed: HashMap::new(),
            flushed_at: None,
            ahead: ahead::Ahead::default(),
            excluded: HashSet::new(),
            disabled: HashSet::new(),
            entry_counts,
            counted_at: Instant::now(),
            ddl: ddl::DdlCheck::new(cache_users),
            seen: visibility::Applied::default(),
            applying_xid: 0,
            invalidations: Vec::new(),
            results: results::Results::default(),
            core_reads,
            applied_xids,
            inflight: HashMap::new(),
            fills: HashMap::new(),
            queued: std::collections::VecDeque::new(),
            open: HashMap::new(),
            running: 0,
            waiting: HashMap::new(),
            next_id: 1,
            fill_tx,
            fill_rx,
            all_tables,
        }
    }

    /// The writer's loop. Ends when `shutdown` fires.
    pub async fn run(
        mut self,
        wake: Arc<Notify>,
        mut wal: mpsc::Receiver<WalEvent>,
        mut admin: mpsc::Receiver<AdminCmd>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        // Resolves `catalog.disabled` against the catalog (nothing is cached yet).
        self.publish_catalog();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Not `biased`: a WAL backlog (catch-up after a restart) must not starve misses and
            // bypass reads, which are what serves clients while hits are off.
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(event) = wal.recv() => self.apply_wal(event).await,
                Some(done) = self.fill_rx.recv() => self.complete_fill(done),
                Some(read) = self.core_reads.recv() => self.install_core_read(read),
                _ = wake.notified() => {
                    self.take_misses();
                    self.take_results();
                }
                Some(cmd) = admin.recv() => self.admin(cmd),
                _ = tick.tick() => {
                    self.take_misses();
                    self.take_results();
                    self.publish_gauges();
                    self.prune_installed();
                    self.count_entries(Instant::now());
                    self.poll_ddl_check(Instant::now());
                    self.prune_seen();
                }
            }
            // Whatever the event changed is in the store now: tracking clients hear of it.
            self.send_invalidations();
        }
    }

    /// Sends the cores the client-tracking invalidations of the changes applied since the last
    /// call (nothing is queued to a core without tracking clients).
    fn send_invalidations(&mut self) {
        if !self.invalidations.is_empty() {
            self.plane.invalidate(&self.invalidations);
            self.invalidations.clear();
        }
    }

    fn publish_gauges(&self) {
        let now_us = crate::clock::unix_now_us();
        if self.repl.streaming.load(Ordering::Acquire) && self.repl.lag_bytes() == 0 {
            // A moment the cache is known current (`lag_ms` reads 0 now). Without recording it,
            // a stream that never saw a catch-up tick (the shared server's WAL end keeps moving)
            // would read as never caught up the moment it drops: lag jumps to "since 1970".
            self.repl
                .caught_up_at_us
                .fetch_max(now_us, Ordering::AcqRel);
        }
        let lag_ms = self.repl.lag_ms(now_us);
        self.plane.publish_replication(Replication {
            streaming: self.repl.streaming.load(Ordering::Relaxed),
            applied_lsn: self.repl.applied_lsn.load(Ordering::Relaxed),
            lag_bytes: self.repl.lag_bytes(),
            lag_ms,
        });
        // `lag_ms` keeps growing from the last moment the cache was known current while the
        // stream is down, so hits flow through a short origin outage and stop once the bound is
        // passed; before the first catch-up it is unbounded, so nothing is served stale at start.
        let serve = lag_ms <= self.runtime.max_lag_ms();
        self.plane.set_serve_hits(serve);
    }

    // ---- misses -------------------------------------------------------------------------

    /// Drains every core's miss queue, answers what the store now has, leases and batches the
    /// rest: a key joins the queued fill of its table, and queued fills start while fewer than
    /// [`FILLS_IN_FLIGHT`] are running.
    fn take_misses(&mut self) {
        for core in 0..self.plane.cores() {
            while let Some(req) = self.plane.recv_miss(core) {
                let rid = self.next_id;
                self.next_id += 1;
                let n = req.keys.len();
                self.waiting.insert(
                    rid,
                    Waiting {
                        core,
                        conn: req.conn,
                        seq: req.seq,
                        results: vec![None; n],
                        remaining: n,
                        current_only: req.current_only,
                        lsn: 0,
                    },
                );
                for (idx, key) in req.keys.into_iter().enumerate() {
                    let Some(table) = self.catalog.get(key.table).cloned() else {
                        // No longer cached: RESP reads it as absent, PostgreSQL asks the origin.
                        let result = if req.current_only {
                            FillResult::Error(Arc::from(NOT_CURRENT))
                        } else {
                            FillResult::Absent
                        };
                        self.resolve(rid, idx, result, 0);
                        continue;
                    };
                    let install = !req.bypass && !self.disabled.contains(&key.table);
                    if req.current_only && !install {
                        // Nothing this read installs can be checked current: the statement
                        // goes to the origin, without a fill first.
                        self.resolve(rid, idx, FillResult::Error(Arc::from(NOT_CURRENT)), 0);
                        continue;
                    }
                    if install {
                        if let Some(found) = self.lookup(key.table, &key.pk) {
                            self.resolve(rid, idx, found, 0);
                            continue;
                        }
                        if let Some(&(fid, slot)) = self.inflight.get(&(key.table, key.pk.clone()))
                        {
                            if let Some(fill) = self.fills.get_mut(&fid) {
                                fill.keys[slot].waiters.push((rid, idx));
                                continue;
                            }
                        }
                    }
                    let batch_key = (key.table, install);
                    let room = |fid: &u64| {
                        self.fills
                            .get(fid)
                            .is_some_and(|f| f.keys.len() < self.runtime.fill_batch())
                    };
                    let fid = match self.open.get(&batch_key) {
                        Some(&fid) if room(&fid) => fid,
                        _ => {
                            let fid = self.next_id;
                            self.next_id += 1;
                            self.fills.insert(
                                fid,
                                Fill {
                                    table: table.clone(),
                                    keys: Vec::new(),
                                    on_done: None,
                                    created: Instant::now(),
                                    of_misses: true,
                                },
                            );
                            self.open.insert(batch_key, fid);
                            self.queued.push_back(fid);
                            fid
                        }
                    };
                    let fill = self.fills.get_mut(&fid).expect("fill was just created");
                    let slot = fill.keys.len();
                    if install {
                        // The lease: taken before the origin read starts.
                        self.inflight
                            .insert((key.table, key.pk.clone()), (fid, slot));
                    }
                    fill.keys.push(FillKey {
                        pk: key.pk,
                        install,
                        waiters: vec![(rid, idx)],
                    });
                }
            }
        }
        self.start_queued();
    }

    /// Starts queued fills of misses while fewer than [`FILLS_IN_FLIGHT`] run.
    fn start_queued(&mut self) {
        while self.running < FILLS_IN_FLIGHT {
            let Some(fid) = self.queued.pop_front() else {
                return;
            };
            self.open.retain(|_, open| *open != fid);
            if self.fills.contains_key(&fid) {
                self.running += 1;
                self.start_fill(fid);
            }
        }
    }

    /// What the store holds for a key, as a fill result (the miss raced with another fill).
    fn lookup(&self, table: u32, pk: &[u8]) -> Option<FillResult> {
        let reader = self.store.reader();
        let mut resp_json = Vec::new();
        match reader.read(table, pk, SECTION_RESP_JSON, &mut resp_json) {
            Lookup::Miss => None,
            Lookup::Negative => Some(FillResult::Absent),
            Lookup::Hit => {
                let mut columns = Vec::new();
                if reader.read(table, pk, SECTION_COLUMNS, &mut columns) != Lookup::Hit {
                    return None;
                }
                Some(FillResult::Row(Arc::new(
                    pgline_dataplane::plane::RowBytes { resp_json, columns },
                )))
            }
        }
    }

    fn start_fill(&self, fid: u64) {
        let Some(fill) = self.fills.get(&fid) else {
            return;
        };
        let table = fill.table.clone();
        let pks: Vec<Box<[u8]>> = fill.keys.iter().map(|k| k.pk.clone()).collect();
        let pool = self.pool.clone();
        let tx = self.fill_tx.clone();
        let timeout_ms = self.runtime.query_timeout_ms();
        let delay = Duration::from_millis(self.runtime.fill_delay_ms());
        // The whole fill (its time queued, a pool connection, the read, an injected delay)
        // ends within query_timeout_ms: a key's waiting clients are never held longer than that.
        let left = Duration::from_millis(timeout_ms).saturating_sub(fill.created.elapsed());
        tokio::spawn(async move {
            let work = async {
                let result = match pool.get().await {
                    Ok(client) => fill::fetch(&client, &table, &pks, timeout_ms).await,
                    Err(e) => Err(FillError::Unavailable(e.to_string())),
                };
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                result
            };
            let result = tokio::time::timeout(left, work)
                .await
                .unwrap_or(Err(FillError::Timeout(timeout_ms)));
            let _ = tx.send(FillDone { fill: fid, result });
        });
    }

    fn complete_fill(&mut self, done: FillDone) {
        let Some(fill) = self.fills.remove(&done.fill) else {
            return;
        };
        if fill.of_misses {
            self.running -= 1;
            self.start_queued();
        }
        let lsn = self.repl.applied_lsn.load(Ordering::Relaxed);
        if let Ok(batch) = &done.result {
            self.note_fill_snapshots(batch);
        }
        let mut voided = Vec::new();
        for (slot, key) in fill.keys.into_iter().enumerate() {
            let map_key = (fill.table.id, key.pk);
            let mut leased = key.install && self.inflight.get(&map_key) == Some(&(done.fill, slot));
            if leased {
                self.inflight.remove(&map_key);
                // A change applied before the lease, yet not visible to the read: the read is
                // older than what the writer has applied, so it is treated as voided.
                let snap = done
                    .result
                    .as_ref()
                    .ok()
                    .and_then(|b| b.snapshots.get(slot));
                leased = self
                    .seen
                    .read_is_current(&map_key, snap.and_then(Option::as_deref));
            }
            if !leased && key.install && fill.on_done.is_some() {
                voided.push(map_key.1.clone());
            }
            let read = done.result.as_ref().ok();
            let read_lsn = read.and_then(|b| b.lsns.get(slot)).copied().unwrap_or(0);
            // Known current: read under a lease that held, by a snapshot that sees every
            // change applied to the key, and a clean origin read (not a key text the origin's
            // type rejects, which a statement would get as an error).
            let current = leased
                && !matches!(
                    read.and_then(|b| b.rows.get(slot)),
                    Some(Fetched::Absent { cacheable: false })
                );
            let result = match &done.result {
                Err(e) => FillResult::Error(Arc::from(e.to_string())),
                Ok(batch) => match batch.rows.get(slot) {
                    Some(Fetched::Row(row)) => {
                        if leased {
                            let sections: [&[u8]; 2] = [&row.resp_json, &row.columns];
                            let entry = EntryData {
                                sections: &sections,
                                negative: false,
                                lsn,
                            };
                            if self.install(map_key.0, &map_key.1, &entry) {
                                self.ahead.note(map_key.clone(), read_lsn, lsn);
                            }
                        }
                        FillResult::Row(row.clone())
                    }
                    Some(Fetched::Absent { cacheable }) => {
                        if leased && *cacheable {
                            let entry = EntryData {
                                sections: &[],
                                negative: true,
                                lsn,
                            };
                            if self.install(map_key.0, &map_key.1, &entry) {
                                self.ahead.note(map_key.clone(), read_lsn, lsn);
                            }
                        }
                        FillResult::Absent
                    }
                    None => FillResult::Error(Arc::from("internal: fill returned too few rows")),
                },
            };
            for (rid, idx) in key.waiters {
                let strict = self.waiting.get(&rid).is_some_and(|w| w.current_only);
                let result = if strict && !current && !matches!(result, FillResult::Error(_)) {
                    FillResult::Error(Arc::from(NOT_CURRENT))
                } else {
                    result.clone()
                };
                self.resolve(rid, idx, result, read_lsn);
            }
        }
        if let Some(tx) = fill.on_done {
            let _ = tx.send(done.result.map(|_| voided).map_err(|e| e.to_string()));
        }
    }

    /// Installs a read a core made for a PostgreSQL lookup's miss, if the store lacks the key and
    /// the read is current: its snapshot sees every change applied to the key
    /// ([`visibility::Applied::read_is_current`]) and every change pruning forgot
    /// ([`visibility::Applied::covers`]: the read registered no fill id, so pruning did not
    /// wait for it). A change applied later than this overwrites or voids the entry as for any
    /// installed row. Disabled, removed and uncached tables install nothing. Its snapshot's
    /// xmin becomes a pruning horizon, as a landed fill's does.
    fn install_core_read(&mut self, read: CoreRead) {
        self.seen.horizon(read.snapshot.xmin, self.next_id);
        if self.disabled.contains(&read.table) || self.catalog.get(read.table).is_none() {
            return;
        }
        // Read before a flush (an operator's, the slot's re-creation) or a failover that kept
        // the cache: installing it could bring back what the flush or the failover dropped.
        if self.flushed_at.is_some_and(|at| read.asked <= at) {
            return;
        }
        if self.lookup(read.table, &read.pk).is_some() {
            return;
        }
        let key = (read.table, read.pk);
        if !self.seen.covers(read.snapshot.xmin)
            || !self.seen.read_is_current(&key, Some(&read.snapshot))
        {
            return;
        }
        let lsn = self.repl.applied_lsn.load(Ordering::Relaxed);
        let installed = match &read.row {
            Some(row) => {
                let sections: [&[u8]; 2] = [&row.resp_json, &row.columns];
                let entry = EntryData {
                    sections: &sections,
                    negative: false,
                    lsn,
                };
                self.install(key.0, &key.1, &entry)
            }
            None => {
                let entry = EntryData {
                    sections: &[],
                    negative: true,
                    lsn,
                };
                self.install(key.0, &key.1, &entry)
            }
        };
        if installed {
            self.ahead.note(key, read.lsn, lsn);
        }
    }

    /// Inserts into the store and records the install time; false if the store refused it.
    fn install(&mut self, table: u32, pk: &[u8], entry: &EntryData<'_>) -> bool {
        let ok = self.store.insert(table, pk, entry).is_ok();
        if ok {
            self.installed.insert((table, pk.into()), Instant::now());
        }
        ok
    }

    /// Removes one key from the store (and its install time).
    fn uninstall(&mut self, table: u32, pk: &[u8]) -> bool {
        self.installed.remove(&(table, Box::<[u8]>::from(pk)));
        self.store.remove(table, pk)
    }

    /// Drops install times of keys the store evicted, once they outnumber the live entries.
    fn prune_installed(&mut self) {
        let live = self.store.stats().entries as usize;
        if self.installed.len() <= 2 * live + 4096 {
            return;
        }
        let store = &self.store;
        self.installed
            .retain(|(t, pk), _| store.meta(*t, pk).is_some());
    }

    /// Publishes the catalog (to the API) and its key space (to the cores), after re-resolving
    /// `catalog.disabled` against it (a table newly disabled loses its entries).
    fn publish_catalog(&mut self) {
        let disabled: HashSet<u32> = self
            .cfg
            .catalog
            .disabled
            .iter()
            .filter_map(|name| self.catalog.find(name).map(|t| t.id))
            .collect();
        let newly: Vec<u32> = disabled.difference(&self.disabled).copied().collect();
        self.disabled = disabled;
        for id in newly {
            let n = self.drop_table(id);
            tracing::info!(
                table = id,
                flushed = n,
                "table disabled: reads pass through"
            );
        }
        self.plane.publish_keyspace(self.catalog.keyspace());
        self.catalog_cell.publish(self.catalog.clone());
    }

    /// Gives key `idx` of request `rid` its result, read at the origin's WAL position `lsn`
    /// (0: not read at the origin); the reply goes once every key has one.
    fn resolve(&mut self, rid: u64, idx: usize, result: FillResult, lsn: u64) {
        let Some(w) = self.waiting.get_mut(&rid) else {
            return;
        };
        if w.results[idx].is_none() {
            w.results[idx] = Some(result);
            w.remaining -= 1;
            w.lsn = w.lsn.max(lsn);
        }
        if w.remaining == 0 {
            let w = self.waiting.remove(&rid).expect("present above");
            let results = w
                .results
                .into_iter()
                .map(|r| r.unwrap_or(FillResult::Absent))
                .collect();
            self.send(
                w.core,
                MissReply {
                    conn: w.conn,
                    seq: w.seq,
                    results,
                    lsn: w.lsn,
                },
            );
        }
    }

    /// Sends a fill reply (never refused: the plane's full-queue policy) and wakes the core.
    fn send(&mut self, core: usize, reply: MissReply) {
        self.plane.send_reply(core, reply);
    }

    // ---- WAL ----------------------------------------------------------------------------

    async fn apply_wal(&mut self, event: WalEvent) {
        match event {
            WalEvent::Txn(txn) => self.apply_txn(txn).await,
            WalEvent::Progress { lsn } => {
                self.repl.applied_lsn.fetch_max(lsn, Ordering::AcqRel);
            }
            WalEvent::Reset { reason, lsn } => {
                tracing::warn!(%reason, "flushing the cache");
                // A read taken before the new slot may miss a change the slot never streams.
                self.flush_all();
                // The stream restarts at `lsn`, which after a failover may lie below what was
                // applied on the old timeline: the consumer skips nothing above it.
                self.repl.applied_lsn.store(lsn, Ordering::Release);
            }
            WalEvent::Failover { fork } => self.kept_over_failover(fork),
        }
        self.ahead
            .applied(self.repl.applied_lsn.load(Ordering::Acquire));
        self.publish_gauges();
    }

    /// A failover kept the cache: the new primary's timeline forks from the old one at `fork`.
    /// What was read on the old primary past the fork may hold commits that died with it, and
    /// no WAL will ever correct it (see [`ahead`]): rows read past it go, stored answers all go
    /// (they are recomputed on demand), and reads still in flight are refused.
    fn kept_over_failover(&mut self, fork: u64) {
        self.flushed_at = Some(Instant::now());
        self.inflight.clear();
        self.results
            .drop_every_answer(&mut self.store, &self.leases);
        match self.ahead.past(fork) {
            Some(keys) => {
                tracing::info!(
                    rows = keys.len(),
                    "failover: dropping the rows read on the old primary past the fork"
                );
                for (t, pk) in keys {
                    self.void(t, &pk);
                    self.uninstall(t, &pk);
                }
            }
            None => {
                tracing::warn!(
                    "failover: more rows were read past the applied WAL than are tracked \
                     ({}); flushing the cache",
                    ahead::MAX_AHEAD
                );
                self.flush_all();
            }
        }
    }

    /// Empties the store and everything that describes it, and refuses every read still to
    /// land (fills, core reads, result answers): each was taken before the flush. An operator's
    /// `FLUSHALL`, a re-created slot and a failover that lost track of its reads all flush so.
    fn flush_all(&mut self) {
        self.flushed_at = Some(Instant::now());
        self.store.clear();
        self.invalidations.clear();
        self.invalidations.push(Invalidation::All);
        self.inflight.clear();
        self.installed.clear();
        self.ahead.clear();
        self.results.clear(&self.leases);
    }

    async fn apply_txn(&mut self, txn: WalTxn) {
        self.applying_xid = txn.xid;
        // Before any change of it reaches the store: a core that read the store (or any state
        // after it) then loads this xid or a later one (`crate::corefill`).
        if txn.xid != 0 {
            self.applied_xids.applying(txn.xid);
        }
        for change in txn.changes {
            let table = self.catalog.get(results::change_rel(&change)).cloned();
            self.results.row_changed(
                &mut self.store,
                &self.leases,
                &change,
                table.as_deref(),
                txn.xid,
            );
            match change {
                Change::Relation(rel) => self.apply_relation(rel).await,
                Change::Insert { rel, new } => self.apply_upsert(rel, None, &new, txn.end_lsn),
                Change::Update { rel, old_key, new } => {
                    self.apply_upsert(rel, old_key.as_deref(), &new, txn.end_lsn)
                }
                Change::Delete { rel, old_key } => self.apply_delete(rel, &old_key, txn.end_lsn),
                Change::Truncate { rels } => {
                    for rel in rels {
                        self.drop_table(rel);
                    }
                }
                Change::Invalidate { rels } => {
                    let mut dropped = 0;
                    for &rel in &rels {
                        dropped += self.drop_table(rel);
                    }
                    tracing::info!(
                        xid = txn.xid,
                        tables = ?rels,
                        entries = dropped,
                        "a transaction too large to buffer committed: flushed its tables"
                    );
                }
            }
        }
        self.applying_xid = 0;
        if txn.commit_ts_us > 0 {
            self.repl
                .applied_commit_ts_us
                .store(txn.commit_ts_us, Ordering::Relaxed);
        }
        self.repl
            .applied_lsn
            .fetch_max(txn.end_lsn, Ordering::AcqRel);
    }

    /// Drops a table's entries and voids its leases; returns how many entries were dropped.
    fn drop_table(&mut self, rel: u32) -> u64 {
        if self.applying_xid != 0 {
            self.seen.table_changed(rel, self.applying_xid);
        }
        self.results
            .table_changed(&mut self.store, &self.leases, rel, self.applying_xid);
        self.inflight.retain(|(t, _), _| *t != rel);
        self.installed.retain(|(t, _), _| *t != rel);
        self.invalidations.push(Invalidation::Table(rel));
        self.store.remove_table(rel)
    }

    /// A relation message: if the table's shape changed, drop its entries and re-read it.
    async fn apply_relation(&mut self, rel: crate::wal::Relation) {
        if self.relation_moved(&rel) {
            return;
        }
        let known = self.catalog.get(rel.id).cloned();
        let same = known.as_ref().is_some_and(|t| {
            t.columns.len() == rel.columns.len()
                && t.columns.iter().zip(&rel.columns).all(|(a, b)| {
                    a.name == b.name
                        && a.declared_type_oid == b.type_oid
                        && a.declared_typmod == b.type_modifier
                })
        });
        if same {
            return;
        }
        // Not cached: nothing to refresh. (New tables join through the catalog check, which
        // adds them to the publication first; a Relation message of an uncached table is, for
        // one, a partition's, which pgoutput sends beside its root's when it publishes through
        // the root.)
        if known.is_none() {
            return;
        }
        self.drop_table(rel.id);
        let client = match self.pool.get().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(table = rel.id, "catalog refresh failed: {e}");
                return;
            }
        };
        let result = self
            .catalog
            .reload_table(&client, rel.id, &self.cfg.catalog)
            .await;
        if let Err(e) = result {
            tracing::warn!(table = rel.id, "catalog refresh failed: {e}");
        }
        self.publish_catalog();
        tracing::info!(table = %format!("{}.{}", rel.namespace, rel.name), "relation changed: entries dropped, catalog refreshed");
    }

    fn apply_upsert(
        &mut self,
        rel: u32,
        old_key: Option<&[TupleValue]>,
        new: &[TupleValue],
        lsn: u64,
    ) {
        let Some(table) = self.catalog.get(rel).cloned() else {
            self.unknown_relation_changed(rel);
            return;
        };
        let new_values = texts(new);
        let new_pk = table.pk_text(&flatten(&new_values));
        if let Some(old) = old_key {
            let old_pk = table.pk_text(&flatten(&texts(old)));
            if let Some(old_pk) = old_pk {
                if Some(&old_pk) != new_pk.as_ref() {
                    // The key changed: the row is gone under its old key.
                    self.void(rel, &old_pk);
                    if self.store.meta(rel, &old_pk).is_some() {
                        let entry = EntryData {
                            sections: &[],
                            negative: true,
                            lsn,
                        };
                        if !self.install(rel, &old_pk, &entry) {
                            self.uninstall(rel, &old_pk);
                        }
                    }
                }
            }
        }
        let Some(pk) = new_pk else { return };
        self.void(rel, &pk);
        if self.store.meta(rel, &pk).is_none() {
            return;
        }
        if new_values.iter().any(Option::is_none) {
            // An unchanged TOASTed value is not in the WAL: the row cannot be rebuilt here.
            self.uninstall(rel, &pk);
            return;
        }
        let row = encode_row(&table, &flatten(&new_values));
        let sections: [&[u8]; 2] = [&row.resp_json, &row.columns];
        let entry = EntryData {
            sections: &sections,
            negative: false,
            lsn,
        };
        if !self.install(rel, &pk, &entry) {
            self.uninstall(rel, &pk);
        }
    }

    fn apply_delete(&mut self, rel: u32, old_key: &[TupleValue], lsn: u64) {
        let Some(table) = self.catalog.get(rel).cloned() else {
            self.unknown_relation_changed(rel);
            return;
        };
        let Some(pk) = table.pk_text(&flatten(&texts(old_key))) else {
            return;
        };
        self.void(rel, &pk);
        if self.store.meta(rel, &pk).is_some() {
            let entry = EntryData {
                sections: &[],
                negative: true,
                lsn,
            };
            if !self.install(rel, &pk, &entry) {
                self.uninstall(rel, &pk);
            }
        }
    }

    /// Voids the lease on a key, if a fill holds one (and, inside a WAL transaction, remembers
    /// its xid for the commit-visibility check).
    fn void(&mut self, rel: u32, pk: &[u8]) {
        self.invalidations.push(Invalidation::Key {
            table: rel,
            pk: pk.into(),
        });
        let key = (rel, Box::<[u8]>::from(pk));
        self.inflight.remove(&key);
        if self.applying_xid != 0 {
            self.seen.key_changed(key, self.applying_xid);
        }
    }

    /// A change of a table the catalog does not hold (yet): ignored, but remembered as a change
    /// of the whole table, so that if the table is added now (`AddTable`), its first fills are
    /// checked against it like any other applied change.
    fn unknown_relation_changed(&mut self, rel: u32) {
        if self.applying_xid != 0 {
            self.seen.table_changed(rel, self.applying_xid);
        }
    }

    /// Records the xmin of each snapshot a landed fill read under, as a pruning horizon.
    fn note_fill_snapshots(&mut self, batch: &FetchedBatch) {
        let oldest: Option<&Snapshot> =
            batch
                .snapshots
                .iter()
                .flatten()
                .map(|s| &**s)
                .min_by(|a, b| {
                    if fill::xid_precedes(a.xmin, b.xmin) {
                        std::cmp::Ordering::Less
                    } else {
                        std::cmp::Ordering::Greater
                    }
                });
        if let Some(s) = oldest {
            self.seen.horizon(s.xmin, self.next_id);
        }
    }

    /// Forgets applied xids that every fill started from now on is known to see.
    fn prune_seen(&mut self) {
        let oldest_fill = self.fills.keys().min().copied().unwrap_or(u64::MAX);
        self.seen.prune(oldest_fill);
        self.results.prune(&self.leases);
    }
}

/// The payload of a `$<len>\r\n<payload>\r\n` bulk string.
fn bulk_payload(bulk: &[u8]) -> &[u8] {
    let start = memchr_crlf(bulk).map_or(0, |i| i + 2);
    let end = bulk.len().saturating_sub(2).max(start);
    &bulk[start..end]
}

fn memchr_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// Column texts of a WAL tuple; `None` marks an unchanged TOASTed value, `Some(None)` SQL NULL.
fn texts(tuple: &[TupleValue]) -> Vec<Option<Option<&[u8]>>> {
    tuple
        .iter()
        .map(|v| match v {
            TupleValue::Null => Some(None),
            TupleValue::UnchangedToast => None,
            TupleValue::Text(b) => Some(Some(&b[..])),
        })
        .collect()
}

fn flatten<'a>(values: &[Option<Option<&'a [u8]>>]) -> Vec<Option<&'a [u8]>> {
    values.iter().map(|v| v.flatten()).collect()
}
