//! PostgreSQL lookups' misses read on the core's own thread (kernel transport).
//!
//! ```text
//!  core turn: miss::request ── CorePort::send_pg_miss ──▶ CoreFills::take (queued, per core)
//!  after the turn: PgHost::drain ──▶ CoreFills::start: one statement per table (`= ANY` of the
//!      queued keys of all sessions of this core), at most FILLS_PER_CORE in flight, on the
//!      core's current-thread runtime over the core's own fill connections
//!  read lands (same thread) ──▶ current? (its snapshot sees every xid the writer applied)
//!                      ├─ yes: MissReply with the row ──▶ the core's reply lane (apply_reply),
//!                      │        and a CoreRead held for the writer (offered in a burst, below)
//!                      ├─ no, first read: queued again, read by the core's next statement
//!                      └─ no again, or an error: MissReply with FillResult::Error: forwarded
//! ```
//!
//! Purpose: a PostgreSQL-front miss went core → writer (control runtime) → the writer's fill
//! connection task → writer → core: about six thread wakes per miss, most of the miss's cost
//! at low concurrency. Here the read runs on the thread that owns the session, as the relay
//! does (`docs/decisions.md`, "PostgreSQL-front fills run on the core (issue 15)").
//!
//! Place on the path: every miss of a PostgreSQL point lookup on a core that hosts the relay,
//! up to the core's bound; misses that arrive while the core's [`FILLS_PER_CORE`] statements
//! run wait for the next one. Past the bound, misses go to the writer. RESP misses, userspace
//! (DPDK) cores and warming keep the writer's fills.
//!
//! The control threads are woken as seldom as possible: a core's answered reads go to the
//! writer in bursts, held on the core for [`INSTALL_HOLD`] (or until [`INSTALL_BURST`] wait),
//! so a core offers at most one burst a millisecond below that count rather than one per
//! landed statement; and
//! no miss goes to the writer only because the core's statements are busy. Measured
//! (`docs/benchmarks.md`, "misses without waking the control threads"): at 8 clients on a cold
//! store, the control threads' CPU per miss fell from 10.5-11.5 µs to 1.9-2.4 µs.
//!
//! Invariants:
//! - An answer is given only when known current: the read's snapshot sees every transaction the
//!   writer had applied when the read landed. The writer records each xid it applies in
//!   [`AppliedXids`] before the transaction's changes reach the store, and the core checks the
//!   snapshot against it after the read returned, so after anything the session observed (a hit,
//!   a fence). An applied xid below the snapshot's xmin is seen; one at or above it must be
//!   below xmax and not in the snapshot's in-progress list. The last
//!   [`RECENT_XIDS`](crate::fill::RECENT_XIDS) applied xids are kept for that; when one older
//!   than them is not below xmin (a transaction open for that long holds xmin back), the read is
//!   not known current. Such a key is read once more (the next snapshot sees the transaction
//!   the first missed, which committed before pgline applied it); if that read is not known
//!   current either, the answer is [`FillResult::Error`] and the core forwards the batch.
//! - The store is written only by the writer: a current read is offered to it as a
//!   [`CoreRead`] (dropped when the writer's queue is full: a dropped install costs a later
//!   miss), and the writer installs it only under its own rules (`Writer::install_core_read`).
//!   Those rules do not depend on when the read arrives: one held for [`INSTALL_HOLD`] is
//!   checked against everything applied meanwhile, and refused if pruning forgot what it needs
//!   or an operator flushed after its statement was sent (`CoreRead::asked`).
//! - The session's fence is raised to the fill statement's WAL position, as for a writer fill.
//!
//! Bounds: per core, at most [`FILLS_PER_CORE`] statements in flight, `resp.miss_queue`
//! misses queued or in flight, the core's RESP misses waiting for the writer included (past it
//! the miss is given back: the writer takes it if its lane has room, else the batch is
//! forwarded), and fewer than [`INSTALL_BURST`] reads held; each read, a second one included,
//! ends within `origin.query_timeout_ms` of its key's arrival. A fill connection
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
use crate::fill::{self, AppliedXids, Fetched, FetchedBatch, FillError, Snapshot};
use crate::writer::CoreRead;

/// Fill statements in flight per core, as the writer's bound for all of its misses.
pub const FILLS_PER_CORE: usize = 2;

/// The first pause after a fill connection could not be had; doubles to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a core holds the reads it answered before offering them to the writer together.
/// Each offer wakes a control thread (a context switch on a 2-vCPU machine); holding a read
/// only delays its install, so a lookup of the same key meanwhile misses and reads again.
pub const INSTALL_HOLD: Duration = Duration::from_millis(1);

/// Held reads past which they go to the writer at once.
pub const INSTALL_BURST: usize = 256;

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
    /// Reads answered and not yet offered to the writer (fewer than [`INSTALL_BURST`]); a task
    /// of the core's runtime offers them [`INSTALL_HOLD`] after the first.
    held: Held<CoreRead>,
}

/// A core's answered reads waiting to be offered to the writer together.
#[derive(Debug)]
struct Held<T> {
    items: Vec<T>,
}

/// What adding reads to [`Held`] asks of the caller.
#[derive(Debug, PartialEq)]
enum Hold<T> {
    /// The first reads held: offer what is held [`INSTALL_HOLD`] from now.
    StartTimer,
    /// [`INSTALL_BURST`] or more were held: offer these now (none stay held).
    Burst(Vec<T>),
    /// Held behind the timer already running.
    Wait,
}

impl<T> Held<T> {
    const fn new() -> Held<T> {
        Held { items: Vec::new() }
    }

    fn add(&mut self, items: Vec<T>) -> Hold<T> {
        if items.is_empty() {
            return Hold::Wait;
        }
        let first = self.items.is_empty();
        self.items.extend(items);
        if self.items.len() >= INSTALL_BURST {
            Hold::Burst(std::mem::take(&mut self.items))
        } else if first {
            Hold::StartTimer
        } else {
            Hold::Wait
        }
    }

    fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut self.items)
    }
}

/// A miss waiting for its read.
struct Pending {
    conn: ConnToken,
    seq: u64,
    table: u32,
    pk: Box<[u8]>,
    since: Instant,
    /// Read once already, and that read was not known current.
    reread: bool,
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
                    held: Held::new(),
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
    /// turn ([`CoreFills::start`]), or when one of the core's statements lands. Given back (the
    /// core then offers it to the writer) past the core's bound.
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
        if depths.misses + st.queued.len() + st.running_keys >= depths.capacity {
            return Err(req);
        }
        let key = req.keys.into_iter().next().expect("one key, checked above");
        st.queued.push_back(Pending {
            conn: req.conn,
            seq: req.seq,
            table: key.table,
            pk: key.pk,
            since: Instant::now(),
            reread: false,
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
        // Before the statement leaves: a flush the writer takes after this refuses the read.
        let asked = Instant::now();
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
        self.land(core, table, group, result, down, asked);
        self.start(core);
    }

    /// Answers the misses of a landed read (see the module doc's invariants).
    fn land(
        self: &Arc<Self>,
        core: usize,
        table: u32,
        group: Vec<Pending>,
        result: Result<FetchedBatch, FillError>,
        down: bool,
        asked: Instant,
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
        CoreStats::add(&stats.pg_core_fill_statements, 1);
        let mut offered = Vec::new();
        let mut again = Vec::new();
        for (i, mut p) in group.into_iter().enumerate() {
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
                                offered.push(CoreRead {
                                    table,
                                    pk: p.pk.clone(),
                                    row: row.cloned(),
                                    snapshot: snap,
                                    asked,
                                    lsn,
                                });
                            }
                            (answer, lsn)
                        }
                        // Missed a transaction pgline applied: a later snapshot sees it.
                        (Some(_), Some(_)) if !p.reread => {
                            p.reread = true;
                            again.push(p);
                            continue;
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
        self.hold(core, offered);
        if !again.is_empty() {
            CoreStats::add(&stats.pg_core_fill_rereads, again.len() as u64);
            if let Some(state) = self.cores.get(core) {
                // First in line, as they came first; `since` still bounds them.
                let mut st = lock(state);
                for p in again.into_iter().rev() {
                    st.queued.push_front(p);
                }
            }
        }
    }

    /// Holds answered reads for the writer: the first held starts the [`INSTALL_HOLD`] timer,
    /// and [`INSTALL_BURST`] of them go at once.
    fn hold(self: &Arc<Self>, core: usize, reads: Vec<CoreRead>) {
        let Some(state) = self.cores.get(core) else {
            return;
        };
        let hold = lock(state).held.add(reads);
        match hold {
            Hold::Burst(burst) => self.offer(burst),
            Hold::StartTimer => {
                // A task of the core's runtime (this runs in a read task). A timer left behind
                // by a burst sent early only offers the next reads sooner.
                let fills = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(INSTALL_HOLD).await;
                    if let Some(state) = fills.cores.get(core) {
                        let burst = lock(state).held.take();
                        fills.offer(burst);
                    }
                });
            }
            Hold::Wait => {}
        }
    }

    /// Offers reads to the writer back to back (one wake-up of its thread). Past the writer's
    /// queue bound the rest are dropped: a later miss reads again.
    fn offer(&self, reads: Vec<CoreRead>) {
        for read in reads {
            if self.installs.try_send(read).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_reads_go_to_the_writer_at_the_bound() {
        let mut held = Held::new();
        assert_eq!(held.add(vec![0]), Hold::StartTimer);
        for i in 1..INSTALL_BURST - 1 {
            assert_eq!(held.add(vec![i]), Hold::Wait, "read {i}");
        }
        // The one that reaches the bound sends every held read, in order, and none stay.
        let expected: Vec<usize> = (0..INSTALL_BURST).collect();
        assert_eq!(held.add(vec![INSTALL_BURST - 1]), Hold::Burst(expected));
        assert!(held.take().is_empty());
        // The next read starts a new hold.
        assert_eq!(held.add(vec![7]), Hold::StartTimer);
        assert_eq!(held.take(), vec![7]);
    }

    #[test]
    fn a_statement_past_the_bound_goes_at_once() {
        let mut held = Held::new();
        assert_eq!(held.add(vec![1, 2]), Hold::StartTimer);
        let many: Vec<usize> = (0..INSTALL_BURST + 40).collect();
        match held.add(many) {
            Hold::Burst(burst) => assert_eq!(burst.len(), INSTALL_BURST + 42),
            other => panic!("expected a burst, got {other:?}"),
        }
        // Nothing answered, nothing held, no timer.
        assert_eq!(held.add(Vec::new()), Hold::Wait);
        assert!(held.take().is_empty());
    }
}
