//! PostgreSQL lookups' misses read on the core's own thread (kernel transport).
//!
//! ```text
//!  core turn: miss::request ── CorePort::send_pg_miss ──▶ CoreFills::take (queued, per core)
//!  after the turn: PgHost::drain ──▶ CoreFills::start: one statement per table (`= ANY` of the
//!      queued keys of all sessions of this core), at most FILLS_PER_CORE in flight, on the
//!      core's current-thread runtime over the core's own fill connections
//!  read lands (same thread) ──▶ current? (every xid the writer applied precedes the
//!      snapshot's xmin) ── yes: MissReply with the row ──▶ the core's reply lane (apply_reply),
//!                      │        and a CoreRead to the writer (fire and forget)
//!                      └─ no, or an error: MissReply with FillResult::Error: the core forwards
//! ```
//!
//! Purpose: a PostgreSQL-front miss went core → writer (control runtime) → the writer's fill
//! connection task → writer → core: about six thread wakes per miss, most of the miss's cost
//! at low concurrency. Here the read runs on the thread that owns the session, as the relay
//! does (`docs/decisions.md`, "PostgreSQL-front fills run on the core (issue 15)").
//!
//! Place on the path: a miss of a PostgreSQL point lookup on a core that hosts the relay,
//! while one of the core's [`FILLS_PER_CORE`] statements is free; past that, misses go to the
//! writer, whose fills run on the control plane's threads beside the core (measured: at 32
//! clients the core alone was 10% slower than the writer). RESP misses, userspace (DPDK)
//! cores and warming keep the writer's fills.
//!
//! Invariants:
//! - An answer is given only when known current: the read's snapshot sees every transaction the
//!   writer had applied when the read landed. The writer records each xid it applies in
//!   [`AppliedXids`] before the transaction's changes reach the store, and the core checks the
//!   snapshot against it after the read returned, so after anything the session observed (a hit,
//!   a fence). An applied xid below the snapshot's xmin is seen; one at or above it must be
//!   below xmax and not in the snapshot's in-progress list. The last [`RECENT_XIDS`] applied
//!   xids are kept for that; when one older than them is not below xmin (a transaction open
//!   for that long holds xmin back), the read is not known current. Then the answer is
//!   [`FillResult::Error`] and the core forwards the batch.
//! - The store is written only by the writer: a current read is offered to it as a
//!   [`CoreRead`] (dropped when the writer's queue is full: a dropped install costs a later
//!   miss), and the writer installs it only under its own rules (`Writer::install_core_read`).
//! - The session's fence is raised to the fill statement's WAL position, as for a writer fill.
//!
//! Bounds: per core, at most [`FILLS_PER_CORE`] statements in flight and `resp.miss_queue`
//! misses queued or in flight, the core's RESP misses waiting for the writer included (past it
//! the miss is given back and the batch forwarded); each
//! read ends within `origin.query_timeout_ms` of its first key's arrival. A fill connection
//! that cannot be had marks the core's fills down for a backoff (50 ms, doubling to 2 s) during
//! which misses are answered [`FillResult::Error`] at once (forwarded), so the core never
//! waits on a dead origin.
//!
//! Thread model: one [`CoreState`] per core, locked only by that core's thread (uncontended);
//! the reads and their connections are tasks of that core's runtime.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgline_dataplane::plane::{
    ConnToken, ControlPort, CoreStats, FillResult, MissReply, MissRequest,
};
use tokio::sync::mpsc;

use crate::catalog::CatalogCell;
use crate::config::Runtime;
use crate::fill::{self, Fetched, FetchedBatch, FillError, Snapshot};
use crate::writer::CoreRead;

/// Fill statements in flight per core, as the writer's bound for all of its misses.
pub const FILLS_PER_CORE: usize = 2;

/// The first pause after a fill connection could not be had; doubles to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What a miss is told when the read is not known current: the core forwards the statement.
const NOT_CURRENT: &str = "the core's fill read is not known current: ask the origin";

/// One core's misses and fill connections.
struct CoreState {
    /// At most [`FILLS_PER_CORE`] connections, opened on the core's runtime when first used.
    pool: deadpool_postgres::Pool,
    queued: VecDeque<Pending>,
    /// Statements in flight, and the keys they carry.
    running: usize,
    running_keys: usize,
    /// No fill connection until then: misses are forwarded at once.
    down_until: Option<Instant>,
    backoff: Duration,
}

/// A miss waiting for its read.
struct Pending {
    conn: ConnToken,
    seq: u64,
    table: u32,
    pk: Box<[u8]>,
    since: Instant,
}

/// The per-core fills of the PostgreSQL front (see the module doc).
pub struct CoreFills {
    plane: ControlPort,
    catalog: Arc<CatalogCell>,
    runtime: Arc<Runtime>,
    installs: mpsc::Sender<CoreRead>,
    applied: Arc<AppliedXids>,
    cores: Vec<Mutex<CoreState>>,
}

fn lock(m: &Mutex<CoreState>) -> std::sync::MutexGuard<'_, CoreState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Applied xids kept for the check of a core's read: at 1,000 transactions a second, one
/// second of them. A read whose snapshot's xmin is older than the oldest kept is forwarded.
pub const RECENT_XIDS: usize = 1024;

/// The transactions the writer applied, as a core's read must see them (see the module doc).
///
/// Thread model: the writer records, the cores' fill tasks check; both under one short lock,
/// once per applied transaction and once per landed read.
#[derive(Default)]
pub struct AppliedXids {
    inner: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    /// The greatest xid applied (modulo-2^32 order), `None` before the first.
    greatest: Option<u32>,
    /// The last [`RECENT_XIDS`] applied, in apply order.
    ring: VecDeque<u32>,
    /// The greatest xid dropped from `ring`.
    dropped: Option<u32>,
}

/// The later of two xids in modulo-2^32 order.
fn later(a: Option<u32>, b: u32) -> u32 {
    match a {
        Some(a) if !fill::xid_precedes(a, b) => a,
        _ => b,
    }
}

impl AppliedXids {
    /// The writer, before any change of transaction `xid` reaches the store.
    pub fn applying(&self, xid: u32) {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.greatest = Some(later(r.greatest, xid));
        if r.ring.len() == RECENT_XIDS {
            let old = r.ring.pop_front().expect("the ring is full");
            r.dropped = Some(later(r.dropped, old));
        }
        r.ring.push_back(xid);
    }

    /// Whether `snap` sees every transaction applied so far.
    pub fn seen_by(&self, snap: &Snapshot) -> bool {
        let unsure: Vec<u32> = {
            let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match r.greatest {
                None => return true,
                Some(g) if fill::xid_precedes(g, snap.xmin) => return true,
                Some(_) => {}
            }
            if r.dropped.is_some_and(|d| !fill::xid_precedes(d, snap.xmin)) {
                return false;
            }
            r.ring
                .iter()
                .copied()
                .filter(|&x| !fill::xid_precedes(x, snap.xmin))
                .collect()
        };
        // At or above xmin: seen if below xmax and not in progress. Offsets from xmin order
        // the in-progress list for a binary search (it can be as long as the connections).
        let mut in_progress: Vec<u32> =
            snap.xip.iter().map(|x| x.wrapping_sub(snap.xmin)).collect();
        in_progress.sort_unstable();
        unsure.into_iter().all(|x| {
            fill::xid_precedes(x, snap.xmax)
                && in_progress
                    .binary_search(&x.wrapping_sub(snap.xmin))
                    .is_err()
        })
    }
}

impl CoreFills {
    /// `pools` holds one fill pool per core (pgline's origin credentials, at most
    /// [`FILLS_PER_CORE`] connections each).
    pub fn new(
        plane: ControlPort,
        catalog: Arc<CatalogCell>,
        runtime: Arc<Runtime>,
        installs: mpsc::Sender<CoreRead>,
        applied: Arc<AppliedXids>,
        pools: Vec<deadpool_postgres::Pool>,
    ) -> Arc<CoreFills> {
        let cores = pools
            .into_iter()
            .map(|pool| {
                Mutex::new(CoreState {
                    pool,
                    queued: VecDeque::new(),
                    running: 0,
                    running_keys: 0,
                    down_until: None,
                    backoff: FIRST_BACKOFF,
                })
            })
            .collect();
        Arc::new(CoreFills {
            plane,
            catalog,
            runtime,
            installs,
            applied,
            cores,
        })
    }

    /// Queues a PostgreSQL lookup's miss of core `core` (one key); it starts after the core's
    /// turn ([`CoreFills::start`]). Given back (the core then offers it to the writer) while
    /// both of the core's statements are in flight, or past the core's bound.
    pub fn take(&self, core: usize, req: MissRequest) -> Result<(), MissRequest> {
        let Some(state) = self.cores.get(core) else {
            return Err(req);
        };
        if req.keys.len() != 1 || req.bypass {
            return Err(req);
        }
        // One bound for the core's misses: its RESP misses waiting for the writer count too.
        let depths = self.plane.shared().queue_depths(core);
        let mut st = lock(state);
        if st.running >= FILLS_PER_CORE
            || depths.misses + st.queued.len() + st.running_keys >= depths.capacity
        {
            return Err(req);
        }
        let key = req.keys.into_iter().next().expect("one key, checked above");
        st.queued.push_back(Pending {
            conn: req.conn,
            seq: req.seq,
            table: key.table,
            pk: key.pk,
            since: Instant::now(),
        });
        Ok(())
    }

    /// Starts queued reads of core `core` while fewer than [`FILLS_PER_CORE`] run: each takes
    /// the queued keys of the oldest miss's table, up to `origin.fill_batch`. Call on the
    /// core's own thread, inside its runtime.
    pub fn start(self: &Arc<Self>, core: usize) {
        let Some(state) = self.cores.get(core) else {
            return;
        };
        let mut st = lock(state);
        while st.running < FILLS_PER_CORE {
            let Some(first) = st.queued.front() else {
                return;
            };
            let table = first.table;
            let most = self.runtime.fill_batch().max(1);
            let mut group = Vec::new();
            let mut rest = VecDeque::with_capacity(st.queued.len());
            for p in st.queued.drain(..) {
                if p.table == table && group.len() < most {
                    group.push(p);
                } else {
                    rest.push_back(p);
                }
            }
            st.queued = rest;
            st.running += 1;
            st.running_keys += group.len();
            let down = st.down_until.is_some_and(|t| Instant::now() < t);
            let pool = st.pool.clone();
            tokio::spawn(self.clone().read(core, table, group, pool, down));
        }
    }

    /// Reads one group's keys and answers each miss.
    async fn read(
        self: Arc<Self>,
        core: usize,
        table: u32,
        group: Vec<Pending>,
        pool: deadpool_postgres::Pool,
        down: bool,
    ) {
        let timeout_ms = self.runtime.query_timeout_ms();
        let delay = Duration::from_millis(self.runtime.fill_delay_ms());
        let first = group
            .iter()
            .map(|p| p.since)
            .min()
            .unwrap_or_else(Instant::now);
        let left = Duration::from_millis(timeout_ms).saturating_sub(first.elapsed());
        let pks: Vec<Box<[u8]>> = group.iter().map(|p| p.pk.clone()).collect();
        let info = self.catalog.get(table);
        let result = match (&info, down) {
            (_, true) => Err(FillError::Unavailable("fill connection down".into())),
            (None, _) => Err(FillError::TableChanged(table.to_string())),
            (Some(info), false) => {
                let work = async {
                    let result = match pool.get().await {
                        Ok(client) => fill::fetch(&client, info, &pks, timeout_ms).await,
                        Err(e) => Err(FillError::Unavailable(e.to_string())),
                    };
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    result
                };
                tokio::time::timeout(left, work)
                    .await
                    .unwrap_or(Err(FillError::Timeout(timeout_ms)))
            }
        };
        self.land(core, table, group, result, down);
        self.start(core);
    }

    /// Answers the misses of a landed read (see the module doc's invariants).
    fn land(
        &self,
        core: usize,
        table: u32,
        group: Vec<Pending>,
        result: Result<FetchedBatch, FillError>,
        down: bool,
    ) {
        if let Some(state) = self.cores.get(core) {
            let mut st = lock(state);
            st.running -= 1;
            st.running_keys -= group.len();
            match &result {
                Err(FillError::Unavailable(_)) if !down => {
                    st.down_until = Some(Instant::now() + st.backoff);
                    st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                }
                Ok(_) => {
                    st.down_until = None;
                    st.backoff = FIRST_BACKOFF;
                }
                Err(_) => {}
            }
        }
        // Checked after the read returned: every change the session observed was recorded
        // before. One check per snapshot (a statement's keys share one).
        let mut checked: Option<(Arc<Snapshot>, bool)> = None;
        let mut current = |snap: &Arc<Snapshot>| match &checked {
            Some((s, seen)) if Arc::ptr_eq(s, snap) => *seen,
            _ => {
                let seen = self.applied.seen_by(snap);
                checked = Some((snap.clone(), seen));
                seen
            }
        };
        let stats = self.plane.shared().stats(core);
        CoreStats::add(&stats.pg_core_fills, group.len() as u64);
        for (i, p) in group.into_iter().enumerate() {
            let (answer, lsn) = match &result {
                Err(e) => (FillResult::Error(Arc::from(e.to_string())), 0),
                Ok(batch) => {
                    let lsn = batch.lsns.get(i).copied().unwrap_or(0);
                    let snap = batch.snapshots.get(i).cloned().flatten();
                    match (batch.rows.get(i), snap) {
                        (Some(fetched), Some(snap)) if current(&snap) => {
                            let (answer, row) = match fetched {
                                Fetched::Row(row) => (FillResult::Row(row.clone()), Some(row)),
                                Fetched::Absent { cacheable: true } => (FillResult::Absent, None),
                                // A key text the origin's type rejects: the statement gets
                                // the origin's error.
                                Fetched::Absent { cacheable: false } => {
                                    (FillResult::Error(Arc::from(NOT_CURRENT)), None)
                                }
                            };
                            if !matches!(answer, FillResult::Error(_)) {
                                // Dropped when the writer is behind: a later miss reads again.
                                let _ = self.installs.try_send(CoreRead {
                                    table,
                                    pk: p.pk.clone(),
                                    row: row.cloned(),
                                    snapshot: snap,
                                });
                            }
                            (answer, lsn)
                        }
                        _ => (FillResult::Error(Arc::from(NOT_CURRENT)), 0),
                    }
                }
            };
            self.plane.send_reply(
                core,
                MissReply {
                    conn: p.conn,
                    seq: p.seq,
                    results: vec![answer],
                    lsn,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(xmin: u32, xmax: u32, xip: &[u32]) -> Snapshot {
        Snapshot {
            xmin,
            xmax,
            xip: xip.to_vec(),
        }
    }

    fn applied(xids: &[u32]) -> AppliedXids {
        let a = AppliedXids::default();
        for &x in xids {
            a.applying(x);
        }
        a
    }

    #[test]
    fn applied_xids_below_the_xmin_are_seen() {
        assert!(applied(&[]).seen_by(&snap(5, 5, &[])), "nothing applied");
        assert!(applied(&[7, 9]).seen_by(&snap(10, 12, &[11])));
        // Modulo 2^32.
        assert!(applied(&[u32::MAX - 2]).seen_by(&snap(3, 3, &[])));
        assert!(!applied(&[4]).seen_by(&snap(u32::MAX - 2, u32::MAX - 1, &[])));
    }

    #[test]
    fn an_applied_xid_above_the_xmin_is_seen_unless_in_progress_or_past_xmax() {
        // Transaction 10 is open (another database's, say); 11 and 12 were applied after it.
        let a = applied(&[11, 12]);
        assert!(a.seen_by(&snap(10, 13, &[10])), "10 holds xmin back");
        assert!(!a.seen_by(&snap(10, 13, &[10, 12])), "12 still in progress");
        assert!(
            !a.seen_by(&snap(10, 12, &[10])),
            "12 at xmax: not begun then"
        );
        assert!(!a.seen_by(&snap(11, 12, &[11])), "xmin itself in progress");
        // Across the wrap, with a long in-progress list.
        let a = applied(&[u32::MAX, 1]);
        let xip: Vec<u32> = (2..400).chain([u32::MAX - 1]).collect();
        assert!(a.seen_by(&snap(u32::MAX - 1, 400, &xip)));
        let xip: Vec<u32> = (1..400).chain([u32::MAX - 1]).collect();
        assert!(!a.seen_by(&snap(u32::MAX - 1, 400, &xip)), "1 in progress");
    }

    #[test]
    fn an_xid_older_than_the_kept_ones_and_not_below_xmin_is_not_known_seen() {
        // 100 applied, then RECENT_XIDS more: 100 is no longer kept.
        let mut xids = vec![100];
        xids.extend((0..RECENT_XIDS as u32).map(|i| 200 + i));
        let a = applied(&xids);
        let xmax = 200 + RECENT_XIDS as u32;
        assert!(!a.seen_by(&snap(90, xmax, &[90])), "100 may be unseen");
        assert!(a.seen_by(&snap(101, xmax, &[101])), "100 is below xmin");
        // Applied out of xid order: the greatest dropped counts, not the last.
        let mut xids = vec![150, 100];
        xids.extend((0..RECENT_XIDS as u32 - 1).map(|i| 200 + i));
        let a = applied(&xids);
        assert!(
            !a.seen_by(&snap(120, xmax, &[120])),
            "150 dropped, above xmin"
        );
        assert!(a.seen_by(&snap(151, xmax, &[151])));
    }
}
