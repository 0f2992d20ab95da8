//! The consumer task: session set-up, the streaming loop, transaction assembly (Begin…Commit
//! and streamed, buffered in [`TxnBuffers`]), feedback and reconnects. See the parent module
//! for the invariants it keeps.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use super::conn::{switch_point, ReplicationConn, ReplicationEvent, SystemInfo};
use super::pgoutput::{parse_message_in, Message};
use super::txnbuf::{Overflowed, TxnBuffers};
use super::{slot, Change, ReplicationState, WalConfig, WalError, WalEvent, WalTxn};
use crate::clock::{unix_now_us, PG_EPOCH_UNIX_US};
use crate::lsn::format_lsn;

/// How a session ended without an error.
enum Stop {
    /// Shutdown was requested (or its sender dropped).
    Shutdown,
    /// The event receiver is gone: nobody applies changes any more.
    ReceiverGone,
}

/// Runs the WAL consumer until `shutdown` turns true (or its sender or `events`' receiver is
/// dropped). Errors never end it: each is logged, then it backs off and reconnects. The
/// stream and the slot are on `origin` (see [`run_consumer_from`]).
pub async fn run_consumer(
    origin: crate::origin::Settings,
    cfg: WalConfig,
    state: Arc<ReplicationState>,
    events: mpsc::Sender<WalEvent>,
    shutdown: watch::Receiver<bool>,
) {
    run_consumer_from(origin, None, cfg, state, events, shutdown).await
}

/// [`run_consumer`] with the stream and the slot on `replication` (a standby, PostgreSQL 16+)
/// when it is set; the publication stays on `origin`, the primary.
///
/// Failover (a reconnect that lands on another server): `IDENTIFY_SYSTEM` tells a different
/// cluster (different system id) or a promoted standby (same system, new timeline). The cache
/// is kept when the slot is on the new server, usable (synced, not temporary, not
/// invalidated), and the cache has applied nothing past the point where the old timeline
/// ended; streaming then resumes from `applied_lsn`. Otherwise the consumer sends
/// [`WalEvent::Reset`] (flush) and restarts from the slot, created again if it has to be.
pub async fn run_consumer_from(
    origin: crate::origin::Settings,
    replication: Option<crate::origin::Settings>,
    cfg: WalConfig,
    state: Arc<ReplicationState>,
    events: mpsc::Sender<WalEvent>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = cfg.validate() {
        tracing::error!(error = %e, "WAL consumer not started");
        return;
    }
    if let Some(standby) = replication.clone() {
        tokio::spawn(watch_standby_lag(
            standby,
            cfg.status_interval,
            state.clone(),
            shutdown.clone(),
        ));
    }
    let mut streamed_before = false;
    let mut attempt = 0u64;
    // The server the last stream came from, and when that stream was lost.
    let mut streamed_from: Option<SystemInfo> = None;
    let mut lost_at: Option<Instant> = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        if attempt > 0 {
            state.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        attempt += 1;
        let mut session = Session {
            cfg: &cfg,
            state: &state,
            events: &events,
            shutdown: &mut shutdown,
            open: TxnBuffers::new(cfg.max_txn_memory),
            failover_since: None,
            replication: replication.as_ref(),
            last_progress: 0,
            flush_floor: 0,
            marks: VecDeque::new(),
        };
        let result = session
            .run(&origin, &mut streamed_before, &mut streamed_from, lost_at)
            .await;
        state.connected.store(false, Ordering::Release);
        if state.streaming.swap(false, Ordering::AcqRel) {
            lost_at = Some(Instant::now());
        }
        match result {
            Ok(Stop::Shutdown) => break,
            Ok(Stop::ReceiverGone) => {
                tracing::warn!("WAL event receiver dropped; stopping the WAL consumer");
                break;
            }
            Err(e) => tracing::warn!(
                error = %e,
                retryable = e.is_retryable(),
                backoff_ms = cfg.reconnect_backoff.as_millis() as u64,
                "WAL consumer session ended; reconnecting"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.reconnect_backoff) => {}
            r = shutdown.changed() => if r.is_err() { break },
        }
    }
    tracing::info!("WAL consumer stopped");
}

/// While the stream is on a standby: every `period`, its replay delay behind the primary into
/// `state.standby_replay_lag_ms` (which `lag_ms` adds). While the standby cannot be asked, the
/// last value stays and the stream's own lag grows as usual.
async fn watch_standby_lag(
    standby: crate::origin::Settings,
    period: std::time::Duration,
    state: Arc<ReplicationState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = None;
    loop {
        if client.is_none() {
            if let Ok((c, connection)) = standby.pg.connect(standby.pg_tls()).await {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                client = Some(c);
            }
        }
        if let Some(c) = &client {
            match slot::standby_replay_lag_ms(c).await {
                Ok(lag) => state
                    .standby_replay_lag_ms
                    .store(lag.unwrap_or(0), Ordering::Release),
                Err(e) => {
                    tracing::debug!(error = %e, "standby replay lag query failed");
                    client = None;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wait_shutdown(&mut shutdown) => return,
        }
    }
}

/// What [`Session::prepare_origin`] found and did.
struct Prepared {
    /// The slot was created in this session: `Some(its consistent point)`.
    created: Option<u64>,
    /// Why an existing slot was dropped before being created again.
    replaced: Option<String>,
    /// The slot's confirmed position (0 if unknown).
    confirmed: u64,
}

struct Session<'a> {
    cfg: &'a WalConfig,
    state: &'a ReplicationState,
    events: &'a mpsc::Sender<WalEvent>,
    shutdown: &'a mut watch::Receiver<bool>,
    /// The transactions being assembled: Begin seen and Commit not yet, and streamed ones.
    /// A new session starts empty: the server re-sends whatever was open.
    open: TxnBuffers,
    /// This session resumes after a failover whose stream was lost at this instant: set until
    /// it has caught up with the new server (see `note_caught_up`).
    failover_since: Option<Instant>,
    /// Where the stream and the slot are, if not on the origin (a standby).
    replication: Option<&'a crate::origin::Settings>,
    /// Last `Progress` lsn sent.
    last_progress: u64,
    /// The slot's confirmed position at start: a lower `applied_lsn` is not reported (it would
    /// move the slot backwards, e.g. after a reset).
    flush_floor: u64,
    /// (server WAL end, local time it was seen), oldest first: once `applied_lsn` reaches such
    /// an end, the cache reflects the origin as of that time. This is what `lag_ms` measures,
    /// busy or idle.
    marks: VecDeque<(u64, i64)>,
}

/// Most WAL-end marks kept; older ones are dropped (lag then reads a little high, never low).
const MAX_MARKS: usize = 1024;

impl Session<'_> {
    async fn run(
        &mut self,
        origin: &crate::origin::Settings,
        streamed_before: &mut bool,
        streamed_from: &mut Option<SystemInfo>,
        lost_at: Option<Instant>,
    ) -> Result<Stop, WalError> {
        let mut conn = ReplicationConn::connect(self.replication.unwrap_or(origin)).await?;
        self.state.connected.store(true, Ordering::Release);
        let system = conn.identify_system().await?;
        let applied = self.state.applied_lsn.load(Ordering::Acquire);
        // A failover: the server differs from the one the last stream came from.
        let mut failover = false;
        let mut lost = None;
        // Where the new primary's timeline forked from the old one, when the cache may be kept.
        let mut fork = None;
        if let Some(prev) = streamed_from.as_ref().filter(|_| *streamed_before) {
            if prev.system_id != system.system_id {
                failover = true;
                lost = Some(format!(
                    "the origin is a different cluster (system id {}, was {})",
                    system.system_id, prev.system_id
                ));
            } else if prev.timeline != system.timeline {
                failover = true;
                let history = conn.timeline_history(system.timeline).await?;
                match switch_point(&history, prev.timeline) {
                    Some(end) if applied > end => {
                        lost = Some(format!(
                            "the cache applied WAL up to {} but timeline {} ended at {} on the \
                             new primary (timeline {}): those changes do not exist there",
                            format_lsn(applied),
                            prev.timeline,
                            format_lsn(end),
                            system.timeline
                        ))
                    }
                    Some(end) => fork = Some(end),
                    None => {
                        lost = Some(format!(
                            "timeline {} is not an ancestor of the new timeline {}",
                            prev.timeline, system.timeline
                        ))
                    }
                }
            }
        }
        let prepared = self
            .prepare_origin(origin, *streamed_before, &mut conn)
            .await?;
        let recreated = prepared.created.is_some() && *streamed_before;
        let reason = match (&lost, recreated) {
            (Some(why), _) => Some(format!("{why}: flushing the cache and refilling")),
            (None, true) if failover => Some(format!(
                "slot {} was not synced to the new primary{}: flushing the cache and refilling",
                self.cfg.slot,
                prepared
                    .replaced
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )),
            (None, true) => Some(format!(
                "replication slot {} was {} and has been re-created: flushing the cache",
                self.cfg.slot,
                prepared.replaced.as_deref().unwrap_or("missing")
            )),
            (None, false) => None,
        };
        if failover {
            self.state.failovers.fetch_add(1, Ordering::Relaxed);
            self.state
                .last_failover_flushed
                .store(reason.is_some(), Ordering::Release);
            self.failover_since = Some(lost_at.unwrap_or_else(Instant::now));
        }
        let reset = reason.is_some();
        if let Some(reason) = reason {
            tracing::warn!(failover, "{reason}");
            self.state.resets.fetch_add(1, Ordering::Relaxed);
            if failover {
                self.state.failover_flushes.fetch_add(1, Ordering::Relaxed);
            }
            let lsn = prepared.created.unwrap_or(prepared.confirmed);
            // WAL positions seen on the old timeline mean nothing on this one.
            self.state.received_lsn.store(lsn, Ordering::Release);
            self.state.server_wal_end.store(lsn, Ordering::Release);
            if let Some(stop) = self.deliver(WalEvent::Reset { reason, lsn }).await {
                return Ok(stop);
            }
            // Until the writer has applied the reset, `applied_lsn` may still be the old
            // timeline's, and transactions below it would be skipped as re-deliveries.
            while self.state.applied_lsn.load(Ordering::Acquire) > lsn {
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => {}
                    _ = wait_shutdown(self.shutdown) => return Ok(Stop::Shutdown),
                }
            }
        } else if let Some(fork) = fork {
            // The cache is kept; what was read on the old primary past the fork is not.
            if let Some(stop) = self.deliver(WalEvent::Failover { fork }).await {
                return Ok(stop);
            }
        }
        let applied = self.state.applied_lsn.load(Ordering::Acquire);
        let start = if reset { 0 } else { applied };
        conn.start_logical(&self.cfg.slot, &self.cfg.publication, start)
            .await?;
        self.state.streaming.store(true, Ordering::Release);
        let proto = conn.proto_version();
        self.state
            .proto_version
            .store(u64::from(proto), Ordering::Relaxed);
        *streamed_before = true;
        tracing::info!(
            slot = %self.cfg.slot,
            start = %format_lsn(start),
            proto,
            timeline = system.timeline,
            system_id = %system.system_id,
            failover,
            flushed = reset,
            "WAL streaming started"
        );
        *streamed_from = Some(system);
        let result = self.stream(&mut conn).await;
        // The session's open transactions go with it: the next one is re-sent them whole.
        self.state.buffered_bytes.store(0, Ordering::Relaxed);
        result
    }

    /// Checks the origin, ensures the publication (on the origin) and the slot (where the
    /// stream is): a missing, temporary or invalidated slot is created again, a failover slot
    /// on a PostgreSQL 17+ primary; an existing slot on such a primary is made one.
    async fn prepare_origin(
        &mut self,
        origin: &crate::origin::Settings,
        streamed_before: bool,
        conn: &mut ReplicationConn,
    ) -> Result<Prepared, WalError> {
        let (client, connection) = origin.pg.connect(origin.pg_tls()).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let standby = match self.replication {
            Some(r) => {
                let (c, connection) = r.pg.connect(r.pg_tls()).await?;
                let d = tokio::spawn(async move {
                    let _ = connection.await;
                });
                Some((c, d))
            }
            None => None,
        };
        let result = async {
            slot::check_wal_level(&client).await?;
            slot::ensure_publication(&client, &self.cfg.publication, &self.cfg.publication_scope)
                .await?;
            let sc = standby.as_ref().map_or(&client, |(c, _)| c);
            if standby.is_some() {
                slot::check_wal_level(sc).await?;
            }
            let version = slot::server_version(sc).await?;
            let on_standby = slot::in_recovery(sc).await?;
            // A slot created on a standby cannot be a failover slot.
            let want_failover = version >= slot::FAILOVER_SLOTS_VERSION && !on_standby;
            let mut replaced = None;
            let mut state = slot::slot_state(sc, &self.cfg.slot, version).await?;
            if let Some(s) = state.as_ref().filter(|s| !s.usable()) {
                let why = match &s.invalidated {
                    Some(r) => format!("invalidated ({r})"),
                    None => "temporary (its synchronization never completed)".to_string(),
                };
                tracing::warn!(slot = %self.cfg.slot, "replication slot is {why}: dropping it");
                slot::drop_slot(sc, &self.cfg.slot).await?;
                replaced = Some(why);
                state = None;
            }
            let mut created = None;
            if state.is_none() {
                if on_standby {
                    slot::log_standby_snapshot(&client).await?;
                }
                let lsn = slot::create_logical_slot(sc, &self.cfg.slot, want_failover).await?;
                tracing::info!(
                    slot = %self.cfg.slot,
                    lsn = %format_lsn(lsn),
                    failover = want_failover,
                    "created replication slot"
                );
                created = Some(lsn);
                state = slot::slot_state(sc, &self.cfg.slot, version).await?;
            }
            let state = state.ok_or_else(|| {
                WalError::Protocol(format!("slot {} vanished after creation", self.cfg.slot))
            })?;
            let mut failover = state.failover;
            if want_failover && !failover {
                slot::enable_failover(conn, &self.cfg.slot).await?;
                tracing::info!(slot = %self.cfg.slot, "replication slot is now a failover slot");
                failover = true;
            }
            self.state.slot_failover.store(failover, Ordering::Release);
            if !streamed_before {
                // The first session's slot, old or new, is what the cache starts from.
                created = None;
            }
            Ok::<_, WalError>(Prepared {
                created,
                replaced,
                confirmed: state.confirmed_flush.unwrap_or(0),
            })
        }
        .await;
        drop(client);
        driver.abort();
        if let Some((c, d)) = standby {
            drop(c);
            d.abort();
        }
        let prepared = result?;
        self.flush_floor = prepared.confirmed;
        Ok(prepared)
    }

    async fn stream(&mut self, conn: &mut ReplicationConn) -> Result<Stop, WalError> {
        let period = self
            .cfg
            .keepalive_request_interval
            .min(self.cfg.status_interval);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_status = Instant::now();
        let mut last_request = Instant::now();
        loop {
            tokio::select! {
                biased;
                r = self.shutdown.changed() => {
                    if r.is_err() || *self.shutdown.borrow() {
                        let _ = self.send_status(conn, false).await;
                        return Ok(Stop::Shutdown);
                    }
                }
                ev = conn.recv() => {
                    let reply = self.process_event(ev?).await?;
                    match reply {
                        Flow::Continue => {}
                        Flow::Reply => {
                            self.send_status(conn, false).await?;
                            last_status = Instant::now();
                        }
                        Flow::Stop(stop) => return Ok(stop),
                    }
                }
                _ = tick.tick() => {
                    self.note_caught_up();
                    let now = Instant::now();
                    // Ask for a keepalive on every interval, busy or idle: its WAL end is what
                    // lets applied_lsn (and so lag_ms) move past WAL we are not sent.
                    let request =
                        now.duration_since(last_request) >= self.cfg.keepalive_request_interval;
                    if request || now.duration_since(last_status) >= self.cfg.status_interval {
                        self.send_status(conn, request).await?;
                        last_status = now;
                        if request {
                            last_request = now;
                        }
                    }
                }
            }
        }
    }

    /// write = received, flush = apply = applied (never below the slot's start position).
    async fn send_status(
        &self,
        conn: &mut ReplicationConn,
        reply_requested: bool,
    ) -> Result<(), WalError> {
        let applied = self.state.applied_lsn.load(Ordering::Acquire);
        let received = self.state.received_lsn.load(Ordering::Acquire).max(applied);
        let flush = if applied >= self.flush_floor {
            applied
        } else {
            0
        };
        conn.send_status(received, flush, flush, reply_requested)
            .await
    }

    /// Remembers that the server's WAL ended at `lsn` now.
    fn mark(&mut self, lsn: u64) {
        let now = unix_now_us();
        match self.marks.back_mut() {
            // Coalesce marks less than a millisecond apart: keep the newest position.
            Some((last_lsn, t)) if now - *t < 1_000 => *last_lsn = (*last_lsn).max(lsn),
            Some((last_lsn, _)) if *last_lsn >= lsn => {}
            _ => {
                if self.marks.len() == MAX_MARKS {
                    self.marks.pop_front();
                }
                self.marks.push_back((lsn, now));
            }
        }
    }

    fn note_caught_up(&mut self) {
        let applied = self.state.applied_lsn.load(Ordering::Acquire);
        let mut reached = None;
        while let Some(&(lsn, t)) = self.marks.front() {
            if lsn > applied {
                break;
            }
            reached = Some(t);
            self.marks.pop_front();
        }
        if let Some(t) = reached {
            self.state.caught_up_at_us.fetch_max(t, Ordering::AcqRel);
        }
        if applied >= self.state.server_wal_end.load(Ordering::Acquire) {
            self.state
                .caught_up_at_us
                .store(unix_now_us(), Ordering::Release);
            if let Some(since) = self.failover_since.take() {
                let gap_ms = since.elapsed().as_millis() as u64;
                self.state
                    .last_failover_gap_ms
                    .store(gap_ms, Ordering::Release);
                tracing::info!(
                    gap_ms,
                    flushed = self.state.last_failover_flushed.load(Ordering::Acquire),
                    slot_failover = self.state.slot_failover.load(Ordering::Acquire),
                    failovers = self.state.failovers.load(Ordering::Relaxed),
                    applied = %format_lsn(applied),
                    "failover complete: streaming from the new primary and caught up"
                );
            }
        }
    }

    async fn process_event(&mut self, ev: ReplicationEvent) -> Result<Flow, WalError> {
        match ev {
            ReplicationEvent::XLogData {
                wal_start,
                wal_end,
                data,
            } => {
                let end = wal_end.max(wal_start);
                self.mark(end);
                self.state.received_lsn.fetch_max(end, Ordering::AcqRel);
                self.state.server_wal_end.fetch_max(end, Ordering::AcqRel);
                let (sub, msg) = parse_message_in(&data, self.open.in_block())?;
                self.process_message(msg, sub, data.len()).await
            }
            ReplicationEvent::Keepalive {
                wal_end,
                server_time_us,
                reply_requested,
            } => {
                self.mark(wal_end);
                self.state.received_lsn.fetch_max(wal_end, Ordering::AcqRel);
                self.state
                    .server_wal_end
                    .fetch_max(wal_end, Ordering::AcqRel);
                self.state.last_server_time_us.store(
                    server_time_us.saturating_add(PG_EPOCH_UNIX_US),
                    Ordering::Release,
                );
                let applied = self.state.applied_lsn.load(Ordering::Acquire);
                // Open streamed transactions do not hold Progress back: their commit comes
                // after this wal_end, and the server re-sends them whole from the slot's
                // restart point after a reconnect.
                if !self.open.in_txn() && wal_end > self.last_progress && wal_end > applied {
                    // Progress is advisory and superseded by the next one: never wait for room
                    // (a slow applier would otherwise stall the stream and its feedback).
                    match self.events.try_send(WalEvent::Progress { lsn: wal_end }) {
                        Ok(()) => self.last_progress = wal_end,
                        Err(mpsc::error::TrySendError::Full(_)) => {}
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            return Ok(Flow::Stop(Stop::ReceiverGone))
                        }
                    }
                }
                Ok(if reply_requested {
                    Flow::Reply
                } else {
                    Flow::Continue
                })
            }
        }
    }

    /// One decoded message; `sub` is the xid a message inside a stream block carried, `wire`
    /// its size on the wire (for the memory bound).
    async fn process_message(
        &mut self,
        msg: Message,
        sub: Option<u32>,
        wire: usize,
    ) -> Result<Flow, WalError> {
        let change = match msg {
            Message::Begin { xid, .. } => {
                if let Some(dropped) = self.open.begin(xid)? {
                    tracing::warn!(
                        xid = dropped,
                        "Begin inside an open transaction; dropped it"
                    );
                    self.publish_buffered();
                }
                return Ok(Flow::Continue);
            }
            Message::Commit {
                commit_lsn,
                end_lsn,
                commit_ts,
                ..
            } => {
                let txn = self
                    .open
                    .commit(commit_lsn, end_lsn, to_unix_us(commit_ts))?;
                return self.process_commit(txn).await;
            }
            Message::StreamStart { xid, first_segment } => {
                self.open.stream_start(xid, first_segment)?;
                return Ok(Flow::Continue);
            }
            Message::StreamStop => {
                self.open.stream_stop()?;
                return Ok(Flow::Continue);
            }
            Message::StreamCommit {
                xid,
                commit_lsn,
                end_lsn,
                commit_ts,
                ..
            } => {
                let txn =
                    self.open
                        .stream_commit(xid, commit_lsn, end_lsn, to_unix_us(commit_ts))?;
                return self.process_commit(txn).await;
            }
            Message::StreamAbort { xid, subxid, .. } => {
                self.open.stream_abort(xid, subxid);
                self.publish_buffered();
                return Ok(Flow::Continue);
            }
            Message::Relation(rel) => {
                if !self.open.in_txn() && !self.open.in_block() {
                    let txn = WalTxn {
                        xid: 0,
                        commit_lsn: 0,
                        end_lsn: 0,
                        commit_ts_us: 0,
                        changes: vec![Change::Relation(rel)],
                    };
                    return self.deliver_flow(WalEvent::Txn(txn)).await;
                }
                Change::Relation(rel)
            }
            Message::Insert { rel, new } => Change::Insert { rel, new },
            Message::Update { rel, old, new } => Change::Update {
                rel,
                old_key: old.map(|o| o.into_values()),
                new,
            },
            Message::Delete { rel, old } => Change::Delete {
                rel,
                old_key: old.into_values(),
            },
            Message::Truncate { rels, .. } => Change::Truncate { rels },
            Message::Origin { .. } | Message::Type { .. } | Message::Message { .. } => {
                return Ok(Flow::Continue)
            }
        };
        let overflowed = self.open.push(sub, change, wire)?;
        for o in overflowed {
            self.note_overflow(o);
        }
        self.publish_buffered();
        Ok(Flow::Continue)
    }

    fn note_overflow(&self, o: Overflowed) {
        self.state.txn_overflows.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            xid = o.xid,
            mib = o.bytes >> 20,
            limit_mib = self.cfg.max_txn_memory >> 20,
            tables = ?o.rels,
            "transaction exceeds replication.max_txn_memory: its row changes are dropped and its tables flushed at commit"
        );
    }

    /// Publishes the buffered bytes (and their peak).
    fn publish_buffered(&self) {
        let bytes = self.open.bytes() as u64;
        self.state.buffered_bytes.store(bytes, Ordering::Relaxed);
        self.state
            .buffered_peak_bytes
            .fetch_max(bytes, Ordering::Relaxed);
    }

    /// Delivers a committed transaction, unless it is a re-delivery.
    async fn process_commit(&mut self, txn: WalTxn) -> Result<Flow, WalError> {
        self.publish_buffered();
        let applied = self.state.applied_lsn.load(Ordering::Acquire);
        if txn.end_lsn <= applied {
            tracing::debug!(xid = txn.xid, end = %format_lsn(txn.end_lsn), "skipping re-delivered txn");
            return Ok(Flow::Continue);
        }
        let end_lsn = txn.end_lsn;
        let n = txn.changes.len() as u64;
        let flow = self.deliver_flow(WalEvent::Txn(txn)).await?;
        if matches!(flow, Flow::Continue) {
            self.state.txns.fetch_add(1, Ordering::Relaxed);
            self.state.changes.fetch_add(n, Ordering::Relaxed);
            self.last_progress = self.last_progress.max(end_lsn);
        }
        Ok(flow)
    }

    async fn deliver_flow(&mut self, ev: WalEvent) -> Result<Flow, WalError> {
        Ok(match self.deliver(ev).await {
            None => Flow::Continue,
            Some(stop) => Flow::Stop(stop),
        })
    }

    /// Sends `ev` to the store writer, waiting for room; `Some` if the consumer must stop
    /// instead. A shutdown while waiting drops the event (the slot re-sends it next time).
    async fn deliver(&mut self, ev: WalEvent) -> Option<Stop> {
        tokio::select! {
            r = self.events.send(ev) => r.err().map(|_| Stop::ReceiverGone),
            _ = wait_shutdown(self.shutdown) => Some(Stop::Shutdown),
        }
    }
}

/// A pgoutput timestamp (µs since 2000-01-01) as µs since the Unix epoch.
fn to_unix_us(pg_ts: i64) -> i64 {
    pg_ts.saturating_add(PG_EPOCH_UNIX_US)
}

/// Resolves once shutdown is requested or its sender is dropped.
async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|&stop| stop).await;
}

enum Flow {
    Continue,
    /// The server asked for a status update.
    Reply,
    Stop(Stop),
}
