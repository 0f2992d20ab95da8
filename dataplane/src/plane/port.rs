//! The two sides' handles on [`Shared`]: what a core may do, and what the control plane may do.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::keyspace::{KeySpace, KeySpaceCell};
use crate::store::StoreReader;

use super::{
    CoreStats, Invalidation, MissReply, MissRequest, PgHost, PgReply, PgRequest, Replication,
    Shared, Wake,
};

/// One core's side of the plane, owned by that core's thread.
pub struct CorePort {
    shared: Arc<Shared>,
    id: usize,
    /// Misses were sent this turn: wake the miss consumer at the turn's end.
    misses_sent: Cell<bool>,
    /// PostgreSQL requests were sent this turn: wake the relay at the turn's end.
    pg_sent: Cell<bool>,
    /// This core runs the relay on its own thread: nothing on the control side to wake.
    pg_hosted: Cell<bool>,
}

impl CorePort {
    pub(super) fn new(shared: Arc<Shared>, id: usize) -> CorePort {
        CorePort {
            shared,
            id,
            misses_sent: Cell::new(false),
            pg_sent: Cell::new(false),
            pg_hosted: Cell::new(false),
        }
    }

    /// The relay to run on this core's thread, if the control plane offers one.
    pub fn pg_host(&self) -> Option<Arc<dyn PgHost>> {
        self.shared.pg_host.get().cloned()
    }

    /// From now on this core drains its own PostgreSQL requests (with [`CorePort::pg_host`]'s
    /// host, after each turn); the control side no longer takes them or is woken for them.
    /// Called before the core's first turn.
    pub fn set_pg_hosted(&self) {
        self.shared.pg_hosted[self.id].store(true, Ordering::Release);
        self.pg_hosted.set(true);
    }

    /// The core this port belongs to.
    #[inline]
    pub fn id(&self) -> usize {
        self.id
    }

    /// The read-only view every party has (other cores' counters, for `INFO`).
    #[inline]
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// This core's counters (this core is their only writer).
    #[inline]
    pub fn stats(&self) -> &CoreStats {
        &self.shared.stats[self.id]
    }

    #[inline]
    pub fn store(&self) -> &StoreReader {
        &self.shared.store
    }

    #[inline]
    pub fn keyspace(&self) -> &KeySpaceCell {
        &self.shared.keyspace
    }

    /// Whether hits may be served. Relaxed: a core acts on a value at most one turn old.
    #[inline]
    pub fn serve_hits(&self) -> bool {
        self.shared.serve_hits.load(Ordering::Relaxed)
    }

    /// The LSN up to which WAL changes are applied to the store.
    #[inline]
    pub fn applied_lsn(&self) -> u64 {
        self.shared.replication.applied_lsn()
    }

    /// A client id, unique for the process lifetime; [`Shared::core_of_client`] tells its core.
    pub fn next_client_id(&self) -> u64 {
        let n = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        n * self.shared.cores() as u64 + self.id as u64 + 1
    }

    /// Registers what wakes this core from its sleep (once, at start).
    pub fn set_waker(&self, waker: Arc<dyn Wake>) {
        let _ = self.shared.core_wakers[self.id].set(waker);
    }

    /// Records the transport the cores run (`kernel`, `userspace`; the first call wins).
    pub fn set_transport(&self, transport: &'static str) {
        let _ = self.shared.transport.set(transport);
    }

    /// Sends a miss; a full queue gives it back (the caller answers `-BUSY` or skips the fill).
    #[inline]
    pub fn send_miss(&self, request: MissRequest) -> Result<(), MissRequest> {
        self.shared.lanes[self.id].misses.try_push(request)?;
        self.misses_sent.set(true);
        Ok(())
    }

    /// Sends a PostgreSQL lookup's miss: to the relay host's fills on this thread when the core
    /// hosts the relay and one of its fill statements is free (`docs/decisions.md`,
    /// "PostgreSQL-front fills run on the core"), else to the writer. Given back when the
    /// writer's lane is full too.
    #[inline]
    pub fn send_pg_miss(&self, request: MissRequest) -> Result<(), MissRequest> {
        if self.pg_hosted.get() {
            if let Some(host) = self.shared.pg_host.get().filter(|h| h.takes_fills()) {
                // Past the core's bound (or not a one-key lookup): the writer takes it if its
                // lane has room.
                match host.fill(self.id, request) {
                    Ok(()) => return Ok(()),
                    Err(request) => return self.send_miss(request),
                }
            }
        }
        self.send_miss(request)
    }

    /// Sends a PostgreSQL request; a full queue gives it back (the step waits for a later
    /// turn).
    #[inline]
    pub fn send_pg(&self, request: PgRequest) -> Result<(), PgRequest> {
        self.shared.lanes[self.id].pg_requests.try_push(request)?;
        self.pg_sent.set(true);
        Ok(())
    }

    /// Sends a PostgreSQL request that must arrive (a session's Close): never refused, it
    /// waits in order behind a full queue.
    pub fn send_pg_always(&self, request: PgRequest) {
        self.shared.lanes[self.id].pg_requests.push(request);
        self.pg_sent.set(true);
    }

    /// The next fill reply for this core.
    #[inline]
    pub fn recv_reply(&self) -> Option<MissReply> {
        self.shared.lanes[self.id].replies.pop()
    }

    /// The next PostgreSQL reply (or chunk) for this core.
    #[inline]
    pub fn recv_pg_reply(&self) -> Option<PgReply> {
        self.shared.lanes[self.id].pg_replies.pop()
    }

    /// Whether a fill reply or a PostgreSQL reply waits for this core: what a core that is
    /// about to sleep checks after announcing it (see `engine::kernel`'s waker).
    #[inline]
    pub fn replies_waiting(&self) -> bool {
        let lanes = &self.shared.lanes[self.id];
        !lanes.replies.is_empty()
            || !lanes.pg_replies.is_empty()
            || self.shared.tracking[self.id].waiting()
    }

    /// The next invalidation for this core.
    #[inline]
    pub fn recv_invalidation(&self) -> Option<Invalidation> {
        self.shared.tracking[self.id].pop()
    }

    /// Whether invalidations for this core were lost to a full queue since the last call: the
    /// core must then invalidate everything it tracks.
    #[inline]
    pub fn tracking_overflowed(&self) -> bool {
        self.shared.tracking[self.id].take_overflow()
    }

    /// Hands an invalidation (`None`: of everything) from tracking client `from` to its
    /// redirect target `client` on core `core` and wakes it.
    pub fn deliver_invalidation(
        &self,
        core: usize,
        client: u64,
        key: Option<Box<[u8]>>,
        from: u64,
    ) {
        if let Some(lane) = self.shared.tracking.get(core) {
            lane.push(Invalidation::Deliver { client, key, from });
            self.shared.wake_core(core);
        }
    }

    /// Tells tracking client `client`'s core that its redirect target `target` is gone.
    pub fn report_redirect_broken(&self, client: u64, target: u64) {
        let Some(core) = self.shared.core_of_client(client) else {
            return;
        };
        if let Some(lane) = self.shared.tracking.get(core) {
            lane.push(Invalidation::RedirectBroken { client, target });
            self.shared.wake_core(core);
        }
    }

    /// How many replies of one kind a turn takes at most (the queue's bound).
    #[inline]
    pub fn replies_per_turn(&self) -> usize {
        self.shared.lanes[self.id].replies.capacity()
    }

    /// Wakes each control-side consumer this turn sent something to, once.
    #[inline]
    pub fn end_turn(&self) {
        if self.misses_sent.replace(false) {
            self.shared.control_wakers.misses.wake();
        }
        if self.pg_sent.replace(false) && !self.pg_hosted.get() {
            self.shared.control_wakers.pg.wake();
        }
    }
}

/// The control plane's side of the plane (cheap to clone; any task may hold one).
#[derive(Clone)]
pub struct ControlPort {
    shared: Arc<Shared>,
}

impl ControlPort {
    pub(super) fn new(shared: Arc<Shared>) -> ControlPort {
        ControlPort { shared }
    }

    /// The read-only view every party has.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn cores(&self) -> usize {
        self.shared.cores()
    }

    /// The next miss core `core` sent.
    pub fn recv_miss(&self, core: usize) -> Option<MissRequest> {
        self.shared.lanes[core].misses.pop()
    }

    /// Offers the relay to the cores, to run on their own threads (see [`PgHost`]); before the
    /// cores start. The first call wins.
    pub fn set_pg_host(&self, host: Arc<dyn PgHost>) {
        let _ = self.shared.pg_host.set(host);
    }

    /// Whether core `core` drains its own PostgreSQL requests (the relay runs on its thread).
    pub fn pg_hosted(&self, core: usize) -> bool {
        self.shared
            .pg_hosted
            .get(core)
            .is_some_and(|h| h.load(Ordering::Acquire))
    }

    /// The next PostgreSQL request core `core` sent.
    pub fn recv_pg_request(&self, core: usize) -> Option<PgRequest> {
        self.shared.lanes[core].pg_requests.pop()
    }

    /// Sends a fill reply to core `core` and wakes it; never refused (see [`super::lane`]).
    pub fn send_reply(&self, core: usize, reply: MissReply) {
        if let Some(lanes) = self.shared.lanes.get(core) {
            lanes.replies.push(reply);
            self.shared.wake_core(core);
        }
    }

    /// Sends a PostgreSQL reply (or chunk) to core `core` and wakes it; never refused.
    pub fn send_pg_reply(&self, core: usize, reply: PgReply) {
        if let Some(lanes) = self.shared.lanes.get(core) {
            lanes.pg_replies.push(reply);
            self.shared.wake_core(core);
        }
    }

    /// Tells every core with tracking clients what changed, and wakes it. Call after the
    /// changes are in the store. A core whose queue is full forgets everything it tracks
    /// instead (a null invalidation to its clients).
    pub fn invalidate(&self, changes: &[Invalidation]) {
        if changes.is_empty() {
            return;
        }
        super::tracking::writer_fence();
        for (core, lane) in self.shared.tracking.iter().enumerate() {
            if !lane.active() {
                continue;
            }
            for change in changes {
                lane.push(change.clone());
            }
            self.shared.wake_core(core);
        }
    }

    /// Allows or stops hits (the replication bound).
    pub fn set_serve_hits(&self, serve: bool) {
        self.shared.serve_hits.store(serve, Ordering::Release);
    }

    /// Publishes the replication gauge the cores and `INFO` read.
    pub fn publish_replication(&self, r: Replication) {
        self.shared.replication.publish(r);
    }

    /// Publishes a new key space (the cores pick it up at their next turn).
    pub fn publish_keyspace(&self, keyspace: KeySpace) {
        self.shared.keyspace.publish(keyspace);
    }

    /// Publishes the cluster topology, or `None` to leave cluster mode (the cores pick it up at
    /// their next turn).
    pub fn publish_topology(&self, topology: Option<crate::cluster::Topology>) {
        self.shared.topology.publish(topology);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::keyspace::KeySpace;
    use crate::plane::{ConnToken, ControlWakers, FillResult, PgReplyEnd, PgRequestKind};
    use crate::store::{self, StoreConfig};

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    impl Count {
        fn get(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// A plane of one core whose queues hold two messages, with counting wakers.
    fn plane() -> (Arc<Shared>, Arc<Count>, Arc<Count>) {
        let cfg = StoreConfig {
            memory_bytes: 8 << 20,
            segment_bytes: 1 << 20,
            max_page_level: pgline_hugepages::PageLevel::Base,
            prefault: false,
        };
        let (writer, reader) = store::open(&cfg).expect("store");
        // The reader's region must outlive the test.
        std::mem::forget(writer);
        let (misses, pg) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let wakers = ControlWakers {
            misses: misses.clone(),
            pg: pg.clone(),
        };
        let shared = Shared::new(reader, KeySpaceCell::new(KeySpace::new()), 1, 2, wakers);
        (Arc::new(shared), misses, pg)
    }

    fn miss(seq: u64) -> MissRequest {
        MissRequest {
            core: 0,
            conn: ConnToken::new(1, 1),
            seq,
            keys: Vec::new(),
            bypass: false,
            current_only: false,
        }
    }

    fn pg(seq: u64, kind: PgRequestKind) -> PgRequest {
        PgRequest {
            core: 0,
            conn: ConnToken::new(2, 1),
            seq,
            session: 7,
            kind,
            messages: Vec::new(),
            statements: Vec::new(),
            cache: None,
            fence: false,
            state_free: false,
            flow: None,
        }
    }

    /// The writer queues invalidations only to a core with tracking clients; past the queue's
    /// bound nothing more is queued and the core is told once to forget everything.
    #[test]
    fn invalidations_are_bounded_and_overflow_is_told_once() {
        use crate::plane::tracking::{Invalidation, QUEUE_CAPACITY};
        let (shared, _, _) = plane();
        let (control, core) = (shared.control_port(), shared.core_port(0));
        let change = |i: usize| Invalidation::Key {
            table: 1,
            pk: i.to_string().into_bytes().into(),
        };
        control.invalidate(&[change(0)]);
        assert_eq!(
            core.recv_invalidation(),
            None,
            "no tracking client: nothing queued"
        );
        shared.tracking_enter(0);
        let changes: Vec<_> = (0..QUEUE_CAPACITY + 10).map(change).collect();
        control.invalidate(&changes);
        let mut got = 0;
        while let Some(inv) = core.recv_invalidation() {
            assert_eq!(inv, change(got), "in order");
            got += 1;
        }
        assert_eq!(got, QUEUE_CAPACITY);
        assert!(core.tracking_overflowed());
        assert!(!core.tracking_overflowed(), "told once");
        control.invalidate(&[change(1)]);
        assert_eq!(
            core.recv_invalidation(),
            Some(change(1)),
            "the queue works again"
        );
        shared.tracking_leave(0);
    }

    #[test]
    fn each_consumer_is_woken_once_per_turn_and_only_for_its_own_requests() {
        let (shared, misses, pgw) = plane();
        let core = shared.core_port(0);
        core.end_turn();
        assert_eq!(
            (misses.get(), pgw.get()),
            (0, 0),
            "nothing sent, nobody woken"
        );
        core.send_miss(miss(1)).unwrap();
        core.send_miss(miss(2)).unwrap();
        core.end_turn();
        assert_eq!((misses.get(), pgw.get()), (1, 0));
        core.send_pg(pg(3, PgRequestKind::Batch)).unwrap();
        core.end_turn();
        core.end_turn();
        assert_eq!((misses.get(), pgw.get()), (1, 1));
    }

    #[test]
    fn a_full_queue_refuses_requests_but_never_a_close_or_a_reply() {
        let (shared, _, _) = plane();
        let (core, control) = (shared.core_port(0), shared.control_port());
        // Misses: two fit, the third comes back (the core answers -BUSY).
        core.send_miss(miss(1)).unwrap();
        core.send_miss(miss(2)).unwrap();
        assert_eq!(core.send_miss(miss(3)).map_err(|m| m.seq), Err(3));
        assert_eq!(shared.queue_depths(0).misses, 2);
        // PostgreSQL: a step is refused when full, a Close waits behind the queue, and a step
        // cannot overtake the waiting Close even once the queue has room.
        core.send_pg(pg(1, PgRequestKind::Batch)).unwrap();
        core.send_pg(pg(2, PgRequestKind::Batch)).unwrap();
        assert!(core.send_pg(pg(3, PgRequestKind::Batch)).is_err());
        core.send_pg_always(pg(4, PgRequestKind::Close));
        assert_eq!(control.recv_pg_request(0).map(|r| r.seq), Some(1));
        assert!(core.send_pg(pg(5, PgRequestKind::Batch)).is_err());
        let rest: Vec<u64> = std::iter::from_fn(|| control.recv_pg_request(0))
            .map(|r| r.seq)
            .collect();
        assert_eq!(rest, [2, 4]);
        core.send_pg(pg(6, PgRequestKind::Batch)).unwrap();
        // Replies: five into a queue of two, all arrive, in order.
        for seq in 0..5 {
            control.send_reply(
                0,
                MissReply {
                    conn: ConnToken::new(1, 1),
                    seq,
                    results: vec![FillResult::Absent],
                    lsn: 0,
                },
            );
            control.send_pg_reply(
                0,
                PgReply {
                    conn: ConnToken::new(2, 1),
                    seq,
                    bytes: Vec::new(),
                    end: PgReplyEnd::More,
                    fence_lsn: 0,
                    serve_cached: false,
                    unparsed: Vec::new(),
                    unclosed: Vec::new(),
                },
            );
        }
        let replies: Vec<u64> = std::iter::from_fn(|| core.recv_reply())
            .map(|r| r.seq)
            .collect();
        let pg_replies: Vec<u64> = std::iter::from_fn(|| core.recv_pg_reply())
            .map(|r| r.seq)
            .collect();
        assert_eq!(replies, [0, 1, 2, 3, 4]);
        assert_eq!(pg_replies, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn the_control_side_publishes_what_the_cores_read() {
        let (shared, _, _) = plane();
        let (core, control) = (shared.core_port(0), shared.control_port());
        assert!(!core.serve_hits());
        control.set_serve_hits(true);
        control.publish_replication(Replication {
            streaming: true,
            applied_lsn: 42,
            lag_bytes: 1,
            lag_ms: 2,
        });
        assert!(core.serve_hits() && shared.serve_hits());
        assert_eq!(core.applied_lsn(), 42);
        assert_eq!(shared.replication().lag_ms(), 2);
        let before = core.keyspace().generation();
        control.publish_keyspace(KeySpace::new());
        assert_eq!(core.keyspace().generation(), before + 1);
        core.set_transport("userspace");
        assert_eq!(shared.transport(), "userspace");
    }
}
