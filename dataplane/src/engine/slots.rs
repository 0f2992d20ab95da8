//! A core's connection table, the same for both transports: slots with generations, a free
//! list, and the list of connections with work this turn.
//!
//! A connection is named outside the core (in [`crate::plane::MissRequest::conn`]) by a
//! [`ConnToken`] of its slot and the slot's generation, so a reply for a connection that closed
//! while its miss was in flight is recognised and dropped even after the slot is reused.
//!
//! The active list holds each slot at most once (`listed`, per slot rather than per connection,
//! so a connection closed by the transport while listed and a new one filling its slot in the
//! same turn are not listed twice); [`Slots::poll_sessions`] swaps it with a spare list so a
//! turn neither allocates nor visits a slot twice.
//!
//! Latency: a turn in which connections are active records its span once for every request it
//! executed in [`CoreStats::service_time`]: the dataplane's service time of a request batch
//! (parse, execute, compose, transport write), an upper bound for each request in it. The span
//! ends after the session pass; it starts where the previous working pass ended when the core
//! went straight on (so it also covers this turn's readiness poll, replies and keyspace check),
//! or just before the pass after an idle turn or a possible sleep ([`Slots::may_sleep`]). It
//! leaves out the time a request waited before the turn and, for misses, the origin round trip
//! (their replies leave in a later turn). Cost: one clock read per turn under sustained load,
//! two for the first working turn after an idle one, none while idle; shared by the batch.
//!
//! Thread model: owned by one core's thread.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::plane::{ConnToken, CoreStats};

use super::conn::{Conn, RECLAIM_IDLE};
use super::limits::Expiry;
use super::pg;
use super::session::{Next, Worker};
use super::tracking::{self, Notice};

/// The BCAST prefixes of the connections in a core's slots.
struct EntryPrefixes<'a, T>(&'a [Option<Entry<T>>]);

impl<T> tracking::Prefixes for EntryPrefixes<'_, T> {
    fn prefixes(&self, client: u64, slot: usize) -> Option<&[Box<[u8]>]> {
        let conn = &self.0.get(slot)?.as_ref()?.conn;
        if conn.session.client_id != client {
            return None;
        }
        let mode = conn.session.tracking.as_deref()?.mode.as_ref()?;
        Some(&mode.prefixes[..])
    }
}

/// Appends an unsolicited message to `conn`'s output, behind any reply still waiting. A client
/// that lets more than `max_backlog` pile up unread is closed: dropping the message instead would
/// leave its cache stale.
fn deliver(conn: &mut Conn, frame: &[u8], max_backlog: usize) {
    if conn.closing {
        return;
    }
    if conn.backlog() + frame.len() > max_backlog {
        conn.closing = true;
        conn.doomed = true;
        conn.rpos = conn.rbuf.len();
        return;
    }
    if conn.pending.is_empty() {
        if conn.wbuf.len() == conn.wpos {
            conn.wbuf.clear();
            conn.wpos = 0;
        }
        conn.wbuf.extend_from_slice(frame);
    } else {
        conn.pending
            .push_back(super::conn::Pending::Ready(frame.to_vec()));
    }
}

/// One open connection: its session state and the transport's handle and flags.
pub(crate) struct Entry<T> {
    pub conn: Conn,
    pub io: T,
}

/// The transport side of a core, as the table needs it for one turn.
pub(crate) trait Transport {
    type Io;
    /// Ingress, [`Worker::process_requests`] and egress for one connection, bounded.
    fn process(
        &mut self,
        entry: &mut Entry<Self::Io>,
        token: ConnToken,
        worker: &mut Worker,
    ) -> Next;
    /// The session is over: release the transport's side (deregister, close, abort).
    fn release(&mut self, entry: Entry<Self::Io>);
}

pub(crate) struct Slots<T> {
    entries: Vec<Option<Entry<T>>>,
    generations: Vec<u32>,
    /// The slot is on the active list (or in the one being processed, not yet reached).
    listed: Vec<bool>,
    free: Vec<usize>,
    active: Vec<usize>,
    spare: Vec<usize>,
    open: usize,
    /// Of `open`, connections accepted on the PostgreSQL port.
    open_pg: usize,
    /// When the previous session pass ended, if the core has not been able to sleep since: the
    /// start of the next pass's service-time span (saves a clock read per turn under load).
    last_pass_end: Option<Instant>,
}

impl<T> Slots<T> {
    pub fn new() -> Self {
        Slots {
            entries: Vec::new(),
            generations: Vec::new(),
            listed: Vec::new(),
            free: Vec::new(),
            active: Vec::with_capacity(1024),
            spare: Vec::with_capacity(1024),
            open: 0,
            open_pg: 0,
            last_pass_end: None,
        }
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Open connections of one port: PostgreSQL (`pg`) or RESP.
    pub fn open_on(&self, pg: bool) -> usize {
        if pg {
            self.open_pg
        } else {
            self.open - self.open_pg
        }
    }

    /// The core may sleep before its next pass: that pass's span must not start at the last one's
    /// end.
    pub fn may_sleep(&mut self) {
        self.last_pass_end = None;
    }

    /// Whether any connection has work queued for the next turn.
    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// The slot a new connection will take and that slot's generation.
    pub fn vacant(&mut self) -> (usize, u32) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.entries.push(None);
            self.generations.push(0);
            self.listed.push(false);
            self.entries.len() - 1
        });
        (slot, self.generations[slot])
    }

    /// Gives back a slot from [`Slots::vacant`] that was not filled.
    pub fn unvacate(&mut self, slot: usize) {
        self.free.push(slot);
    }

    /// Fills `slot` (from [`Slots::vacant`]) and puts it on the active list.
    pub fn fill(&mut self, slot: usize, conn: Conn, io: T, worker: &mut Worker) {
        let pg = conn.pg.is_some();
        if !pg {
            // A RESP connection may be named as a tracking client's redirect target.
            worker.tracking.conn_opened(conn.session.client_id, slot);
        }
        let stats = worker.stats();
        self.entries[slot] = Some(Entry { conn, io });
        self.list(slot);
        self.open += 1;
        CoreStats::add(&stats.connections_accepted, 1);
        stats
            .connections_open
            .store(self.open as u64, Ordering::Relaxed);
        if pg {
            self.open_pg += 1;
            stats
                .connections_open_pg
                .store(self.open_pg as u64, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Entry<T>> {
        self.entries.get_mut(slot).and_then(Option::as_mut)
    }

    /// Puts `slot` on the active list if it is open and not there yet.
    #[inline]
    pub fn activate(&mut self, slot: usize) {
        if let Some(Some(_)) = self.entries.get(slot) {
            self.list(slot);
        }
    }

    #[inline]
    fn list(&mut self, slot: usize) {
        if !self.listed[slot] {
            self.listed[slot] = true;
            self.active.push(slot);
        }
    }

    /// Frees `slot`; its generation moves on so late replies for it are dropped. The
    /// connection's reply memory and per-source count are released.
    pub fn remove(&mut self, slot: usize, worker: &mut Worker) -> Option<Entry<T>> {
        let mut entry = self.entries.get_mut(slot)?.take()?;
        self.generations[slot] = self.generations[slot].wrapping_add(1);
        self.free.push(slot);
        self.open -= 1;
        worker.release_conn(&mut entry.conn);
        if entry.conn.pg.is_none() {
            worker.tracking.conn_closed(entry.conn.session.client_id);
            if entry
                .conn
                .session
                .tracking
                .as_deref()
                .is_some_and(|t| t.counted)
            {
                worker.port.shared().tracking_leave(worker.port.id());
            }
        }
        worker.buffers.give(std::mem::take(&mut entry.conn.rbuf));
        worker.buffers.give(std::mem::take(&mut entry.conn.wbuf));
        let stats = worker.stats();
        CoreStats::add(&stats.connections_closed, 1);
        stats
            .connections_open
            .store(self.open as u64, Ordering::Relaxed);
        if entry.conn.pg.is_some() {
            self.open_pg -= 1;
            stats
                .connections_open_pg
                .store(self.open_pg as u64, Ordering::Relaxed);
        }
        Some(entry)
    }

    /// Closes `slot` now: the control plane hears of it, the transport releases it.
    fn close<X: Transport<Io = T>>(&mut self, slot: usize, transport: &mut X, worker: &mut Worker) {
        if let Some(Some(entry)) = self.entries.get_mut(slot) {
            let token = ConnToken::new(slot, entry.conn.generation);
            pg::conn_closed(&worker.port, &mut entry.conn, token);
        }
        if let Some(entry) = self.remove(slot, worker) {
            transport.release(entry);
        }
    }

    /// The limits step at the end of a turn, every [`super::limits::SWEEP_EVERY`]: over the
    /// reply-memory cap, the largest holders of unwritten output are closed; timed-out
    /// connections get their error (or are closed if they did not read it); drained buffers
    /// that grew are given back, and freed heap to the kernel after a large release.
    pub fn poll_limits<X: Transport<Io = T>>(&mut self, transport: &mut X, worker: &mut Worker) {
        let now = worker.now;
        if !worker.limits.sweep_due(now) {
            return;
        }
        if worker.limits.full() {
            self.evict(transport, worker);
        }
        for slot in 0..self.entries.len() {
            let Some(Some(entry)) = self.entries.get_mut(slot) else {
                continue;
            };
            match worker.expiry(&entry.conn, now) {
                None => {
                    if entry.conn.shrink_drained() {
                        worker.recharge(&mut entry.conn);
                    }
                    // Idle for a while: its base buffers go back to the core.
                    if now.saturating_duration_since(entry.conn.last_input) >= RECLAIM_IDLE {
                        worker.buffers.reclaim(&mut entry.conn);
                    }
                }
                Some(Expiry::Graceful(timeout)) => {
                    worker.expire(&mut entry.conn, timeout);
                    self.list(slot);
                }
                Some(Expiry::Now) => self.close(slot, transport, worker),
            }
        }
        let freed = worker.buffers.take_freed();
        worker.limits.note_released(freed);
        worker.limits.maybe_trim(now);
    }

    /// Closes the connections holding the most buffer memory (unwritten output their clients do
    /// not read, unparsed input), largest first, until the core is under 3/4 of its
    /// reply-memory cap. Drained buffers were given back before (at the visit or the sweep).
    fn evict<X: Transport<Io = T>>(&mut self, transport: &mut X, worker: &mut Worker) {
        let mut victims: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(slot, e)| {
                e.as_ref()
                    .filter(|e| e.conn.charged > 0)
                    .map(|e| (e.conn.charged, slot))
            })
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let target = worker.limits.reply_memory_cap / 4 * 3;
        for (_, slot) in victims {
            if worker.limits.reply_memory <= target {
                break;
            }
            CoreStats::add(&worker.stats().connections_evicted, 1);
            self.close(slot, transport, worker);
        }
    }

    /// Applies the control plane's answers (RESP misses and PostgreSQL replies) to the
    /// connections waiting for them.
    pub fn poll_replies(&mut self, worker: &Worker) -> bool {
        let mut any = self.poll_pg_replies(worker);
        any |= self.poll_miss_replies(worker);
        any
    }

    fn poll_pg_replies(&mut self, worker: &Worker) -> bool {
        let mut any = false;
        for _ in 0..worker.port.replies_per_turn() {
            let Some(reply) = worker.port.recv_pg_reply() else {
                break;
            };
            any = true;
            let Some(slot) = self.live_slot(reply.conn) else {
                continue;
            };
            if let Some(entry) = self.get_mut(slot) {
                pg::apply_reply(&mut entry.conn, reply);
                self.activate(slot);
            }
        }
        any
    }

    fn poll_miss_replies(&mut self, worker: &Worker) -> bool {
        let mut any = false;
        for _ in 0..worker.port.replies_per_turn() {
            let Some(reply) = worker.port.recv_reply() else {
                break;
            };
            any = true;
            let Some(slot) = self.live_slot(reply.conn) else {
                continue;
            };
            if let Some(entry) = self.get_mut(slot) {
                Worker::apply_reply(&mut entry.conn, &reply);
                self.activate(slot);
            }
        }
        any
    }

    /// Client tracking's turn (issue 18): the checks of hits and key space, the invalidations
    /// queued by the writer and other cores, and the messages they make, appended to the
    /// connections they go to (behind any reply still waiting, so a client never caches a reply
    /// after the invalidation that voids it).
    pub fn poll_tracking(&mut self, worker: &mut Worker) -> bool {
        let table = &mut worker.tracking;
        table.observe(worker.port.serve_hits(), worker.keyspace_generation);
        if worker.port.tracking_overflowed() {
            CoreStats::add(&worker.port.stats().tracking_overflows, 1);
            table.forget_all();
        }
        let prefixes = EntryPrefixes(&self.entries);
        let mut received = false;
        while let Some(inv) = worker.port.recv_invalidation() {
            received = true;
            table.apply(inv, &worker.keyspace, &prefixes);
        }
        let stats = worker.port.stats();
        let gauge = |g: &std::sync::atomic::AtomicU64, v: u64| {
            if g.load(Ordering::Relaxed) != v {
                g.store(v, Ordering::Relaxed);
            }
        };
        gauge(&stats.tracking_keys, table.pairs() as u64);
        gauge(&stats.tracking_evicted, table.evicted);
        gauge(
            &stats.tracking_clients,
            worker.port.shared().tracking_clients(worker.port.id()) as u64,
        );
        if table.notices.is_empty() {
            return received;
        }
        let notices = std::mem::take(&mut table.notices);
        let mut frame = Vec::new();
        let mut sent = 0u64;
        for notice in &notices {
            let (client, message, direct) = match notice {
                Notice::Tracked { client, message } => (*client, message, false),
                Notice::Direct { client, message } => {
                    // A null for a tracking client that redirects goes to its target (which
                    // may neither track nor subscribe, and would otherwise miss it).
                    let redirects = matches!(message, tracking::Message::Null)
                        && worker
                            .tracking
                            .slot_of(*client)
                            .is_some_and(|slot| self.redirects(slot, *client));
                    (*client, message, !redirects)
                }
                Notice::Redirected {
                    client,
                    message,
                    from,
                } => {
                    if worker.tracking.slot_of(*client).is_none() {
                        worker.port.report_redirect_broken(*from, *client);
                        continue;
                    }
                    (*client, message, true)
                }
                Notice::RedirectBroken { client, target } => {
                    if let Some(slot) = worker.tracking.slot_of(*client) {
                        self.redirect_broken(slot, *client, *target, worker);
                    }
                    continue;
                }
            };
            let Some(slot) = worker.tracking.slot_of(client) else {
                continue;
            };
            let target = if direct {
                Some(slot)
            } else {
                self.redirect_target(slot, client, message, worker)
            };
            let Some(target) = target else { continue };
            let Some(entry) = self.get_mut(target) else {
                continue;
            };
            let session = &entry.conn.session;
            let subscribed = session.tracking.as_deref().is_some_and(|t| t.subscribed);
            frame.clear();
            if !tracking::compose(message, session.proto, subscribed, &mut frame) {
                continue;
            }
            sent += 1;
            deliver(&mut entry.conn, &frame, worker.cfg.max_reply_backlog);
            self.activate(target);
        }
        CoreStats::add(&worker.port.stats().tracking_invalidations, sent);
        let mut notices = notices;
        notices.clear();
        worker.tracking.notices = notices;
        true
    }

    /// Where a tracking client's message goes: its own connection, or its redirect target
    /// (another core's through that core's queue, `None` returned). A gone target on this core
    /// marks the redirect broken and tells a RESP3 client so.
    fn redirect_target(
        &mut self,
        slot: usize,
        client: u64,
        message: &tracking::Message,
        worker: &Worker,
    ) -> Option<usize> {
        let entry = self.get_mut(slot)?;
        if entry.conn.session.client_id != client {
            return None;
        }
        let mode = entry.conn.session.tracking.as_deref()?.mode.as_ref()?;
        if mode.redirect == 0 {
            return Some(slot);
        }
        let redirect = mode.redirect;
        let shared = worker.port.shared();
        match shared.core_of_client(redirect) {
            Some(core) if core != worker.port.id() => {
                let key = match message {
                    tracking::Message::Key(k) => Some(k.clone()),
                    tracking::Message::Null => None,
                };
                worker
                    .port
                    .deliver_invalidation(core, redirect, key, client);
                None
            }
            _ => match worker.tracking.slot_of(redirect) {
                Some(target) => Some(target),
                None => {
                    self.redirect_broken(slot, client, redirect, worker);
                    None
                }
            },
        }
    }

    /// Whether connection `client` in `slot` tracks with a redirect.
    fn redirects(&mut self, slot: usize, client: u64) -> bool {
        self.get_mut(slot).is_some_and(|e| {
            e.conn.session.client_id == client
                && e.conn
                    .session
                    .tracking
                    .as_deref()
                    .and_then(|t| t.mode.as_ref())
                    .is_some_and(|m| m.redirect != 0)
        })
    }

    /// Tracking client `client` in `slot` redirects to `target`, which is gone: its redirect is
    /// marked broken and, on RESP3, it is told with a `tracking-redir-broken` push (once per
    /// message that could not be delivered, as Redis). Nothing if the client has since changed
    /// its redirect.
    fn redirect_broken(&mut self, slot: usize, client: u64, target: u64, worker: &Worker) {
        let Some(entry) = self.get_mut(slot) else {
            return;
        };
        let conn = &mut entry.conn;
        if conn.session.client_id != client {
            return;
        }
        let Some(mode) = conn
            .session
            .tracking
            .as_deref_mut()
            .and_then(|t| t.mode.as_mut())
            .filter(|m| m.redirect == target)
        else {
            return;
        };
        mode.broken_redirect = true;
        if conn.session.proto == crate::resp::Protocol::Resp3 {
            let mut frame = Vec::new();
            tracking::compose_redirect_broken(target, &mut frame);
            deliver(conn, &frame, worker.cfg.max_reply_backlog);
            self.activate(slot);
        }
    }

    /// The slot `token` names, if it still holds that connection (not closed, not reused).
    fn live_slot(&mut self, token: ConnToken) -> Option<usize> {
        let slot = token.slot();
        let entry = self.get_mut(slot)?;
        (entry.conn.generation == token.generation()).then_some(slot)
    }

    /// Runs every active connection once through `transport`; closes those that are done.
    pub fn poll_sessions<X: Transport<Io = T>>(
        &mut self,
        transport: &mut X,
        worker: &mut Worker,
    ) -> bool {
        if self.active.is_empty() {
            self.last_pass_end = None;
            return false;
        }
        let start = match self.last_pass_end {
            Some(t) => t,
            None => Instant::now(),
        };
        let before = worker.stats().executed();
        let worked = self.poll_sessions_untimed(transport, worker);
        let end = Instant::now();
        self.last_pass_end = Some(end);
        let stats = worker.stats();
        let executed = stats.executed().wrapping_sub(before);
        if executed > 0 {
            let ns = u64::try_from(end.duration_since(start).as_nanos()).unwrap_or(u64::MAX);
            stats.service_time.record(ns, executed);
        }
        worked
    }

    fn poll_sessions_untimed<X: Transport<Io = T>>(
        &mut self,
        transport: &mut X,
        worker: &mut Worker,
    ) -> bool {
        // Swap with the spare list (both keep their capacity: no allocation per turn).
        let mut active = std::mem::take(&mut self.active);
        std::mem::swap(&mut self.active, &mut self.spare);
        for &slot in &active {
            self.listed[slot] = false;
            let Some(Some(entry)) = self.entries.get_mut(slot) else {
                continue;
            };
            let token = ConnToken::new(slot, entry.conn.generation);
            worker.buffers.lend(&mut entry.conn);
            let next = transport.process(entry, token, worker);
            if worker.limits.full() {
                // At the cap: what this connection has drained goes back now.
                entry.conn.shrink_drained();
            }
            worker.recharge(&mut entry.conn);
            match next {
                Next::Idle => {}
                Next::Again => {
                    self.listed[slot] = true;
                    self.active.push(slot);
                }
                Next::Close => self.close(slot, transport, worker),
            }
        }
        active.clear();
        self.spare = active;
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::keyspace::{KeySpace, KeySpaceCell};
    use crate::plane::{ControlWakers, Shared};
    use crate::store::{self, StoreConfig};

    /// Counts visits per slot io value; every visit leaves the connection idle.
    struct Count(Vec<u32>);
    impl Transport for Count {
        type Io = u32;
        fn process(&mut self, entry: &mut Entry<u32>, _: ConnToken, _: &mut Worker) -> Next {
            self.0.push(entry.io);
            Next::Idle
        }
        fn release(&mut self, _: Entry<u32>) {}
    }

    /// A worker on a 16 MiB store, one core, 16 connections (the engine's unit tests').
    pub(crate) fn worker() -> Worker {
        let cfg = StoreConfig {
            memory_bytes: 16 << 20,
            segment_bytes: 1 << 20,
            max_page_level: pgline_hugepages::PageLevel::Base,
            prefault: false,
        };
        let (writer, reader) = store::open(&cfg).expect("store");
        std::mem::forget(writer);
        let shared = Arc::new(Shared::new(
            reader,
            KeySpaceCell::new(KeySpace::new()),
            1,
            16,
            ControlWakers::none(),
        ));
        let cfg = EngineConfig {
            pg_listen: None,
            pg_cache_users: Vec::new(),
            pg_cache_database: None,
            listen: "127.0.0.1:0".parse().expect("address"),
            cores: 1,
            max_connections: 16,
            max_request_bytes: 1 << 20,
            max_reply_backlog: 1 << 20,
            requests_per_turn: 8,
            max_pending_per_conn: 8,
            spin_polls: 1,
            password: None,
            limits: crate::resp::Limits::default(),
            conn_limits: crate::engine::ConnLimits::default(),
        };
        Worker::new(shared.core_port(0), Arc::new(cfg))
    }

    #[test]
    fn a_slot_reused_while_listed_is_visited_once_and_late_replies_miss_it() {
        let mut w = worker();
        let mut slots = Slots::new();
        let (slot, generation) = slots.vacant();
        slots.fill(slot, w.new_conn(generation), 1, &mut w);
        // Closed by the transport while on the active list, then the slot is filled again.
        assert!(slots.remove(slot, &mut w).is_some());
        let (again, generation2) = slots.vacant();
        assert_eq!(again, slot);
        assert_ne!(
            generation2, generation,
            "a late reply for the old one must not match"
        );
        slots.fill(again, w.new_conn(generation2), 2, &mut w);
        slots.activate(again);
        let mut count = Count(Vec::new());
        assert!(slots.poll_sessions(&mut count, &mut w));
        assert_eq!(count.0, vec![2], "the new connection, once");
        // Idle now: nothing listed; activation lists it again exactly once.
        assert!(!slots.has_active());
        slots.activate(again);
        slots.activate(again);
        slots.poll_sessions(&mut count, &mut w);
        assert_eq!(count.0, vec![2, 2]);
        assert_eq!(slots.open(), 1);
    }
}
