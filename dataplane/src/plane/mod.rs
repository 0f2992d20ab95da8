//! The typed boundary between the dataplane cores and the control plane: two ports over one
//! [`Shared`].
//!
//! Cores never talk to the origin. A lookup that misses (or any lookup while hits are not
//! allowed, see [`Shared::serve_hits`]) becomes a [`MissRequest`] on the core's bounded
//! lock-free queue to the control plane; the answer comes back as a [`MissReply`] on the core's
//! own reply queue, and the core's waker ends its sleep. PostgreSQL connections hand their
//! startup, authentication and forwarded batches over the same way ([`PgRequest`],
//! [`PgReply`]).
//!
//! - A core holds its [`CorePort`]: it sends requests, receives replies, reads the store, the
//!   key space and the replication gauge, and writes its own [`CoreStats`].
//! - The control plane holds a [`ControlPort`]: it receives requests, sends replies, and
//!   publishes the key space, the replication gauge and whether hits may be served.
//! - Everyone may read [`Shared`]'s accessors (counters, queue depths, uptime); no field is
//!   public, so every write goes through one of the two ports.
//!
//! Full queues follow one policy ([`lane`]): a request that may be refused is refused at once
//! (`-BUSY` to a RESP client; a PostgreSQL step waits for a later turn) and counted; a reply or
//! a Close is never refused and waits, in order, behind the full queue. Nobody blocks or sleeps.
//!
//! Each consumer has its own waker: a core's wakes that core, the control side has one for the
//! miss consumer (the store writer) and one for the PostgreSQL relay, and a core's turn wakes
//! each only if it sent that consumer something.
//!
//! The relay may instead run on a core's own thread ([`PgHost`], set by the control plane before
//! the cores start): a kernel-transport core that takes the host drains its own PostgreSQL
//! requests after each turn (no control-side wake, no thread crossing), and the relay's control
//! side leaves that core's queue alone ([`ControlPort::pg_hosted`]).

mod lane;
mod message;
mod port;
mod stats;
mod tracking;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cluster::TopologyCell;
use crate::keyspace::KeySpaceCell;
use crate::store::StoreReader;

use lane::Lane;
pub use message::*;
pub use port::{ControlPort, CorePort};
pub use stats::{CoreStats, LatencyHistogram, Replication, ReplicationGauge, LATENCY_BOUNDS_NS};
pub use tracking::{Invalidation, QUEUE_CAPACITY as TRACKING_QUEUE_CAPACITY};

/// Wakes a sleeping party (a core's poll loop, or a control-plane consumer).
pub trait Wake: Send + Sync {
    fn wake(&self);
}

/// A waker that does nothing (a consumer that polls, or a test that drives by hand).
pub struct NoWake;

impl Wake for NoWake {
    fn wake(&self) {}
}

/// The PostgreSQL relay as a core hosts it on its own thread (see `engine::kernel`).
pub trait PgHost: Send + Sync {
    /// Takes core `core`'s PostgreSQL requests and starts their work on the calling thread's
    /// tokio runtime (the core's own); called by that core after each of its turns.
    fn drain(&self, core: usize);

    /// Takes a PostgreSQL lookup's miss (`current_only`) of core `core` to read on the calling
    /// thread's runtime instead of the writer's; its [`MissReply`] arrives on the core's reply
    /// lane as the writer's would. Gives the request back when the core's fill statements are
    /// all in flight or its misses are at their bound (the caller offers it to the writer).
    /// Called only by a core that hosts the relay.
    fn fill(&self, core: usize, request: MissRequest) -> Result<(), MissRequest>;

    /// Whether [`PgHost::fill`] takes misses (else they go to the writer).
    fn takes_fills(&self) -> bool;
}

/// The control plane's two consumers of core traffic, each with its own waker.
pub struct ControlWakers {
    /// The miss consumer (the store writer): a core sent [`MissRequest`]s.
    pub misses: Arc<dyn Wake>,
    /// The PostgreSQL relay: a core sent [`PgRequest`]s.
    pub pg: Arc<dyn Wake>,
}

impl ControlWakers {
    /// Wakers that do nothing (for a harness that polls the queues itself).
    pub fn none() -> ControlWakers {
        ControlWakers {
            misses: Arc::new(NoWake),
            pg: Arc::new(NoWake),
        }
    }
}

/// The lanes of one core.
struct CoreLanes {
    misses: Lane<MissRequest>,
    replies: Lane<MissReply>,
    /// PostgreSQL-protocol work this core hands the control plane.
    pg_requests: Lane<PgRequest>,
    /// The control plane's PostgreSQL-protocol replies to this core.
    pg_replies: Lane<PgReply>,
}

impl CoreLanes {
    fn new(capacity: usize) -> Self {
        CoreLanes {
            misses: Lane::new(capacity),
            replies: Lane::new(capacity),
            pg_requests: Lane::new(capacity),
            pg_replies: Lane::new(capacity),
        }
    }
}

/// Messages waiting in one core's lanes (a snapshot, for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepths {
    pub misses: usize,
    pub replies: usize,
    pub pg_requests: usize,
    pub pg_replies: usize,
    /// Each queue's bound (`resp.miss_queue`).
    pub capacity: usize,
}

/// State shared by all cores and the control plane. Read through its accessors; written only
/// through a [`CorePort`] or the [`ControlPort`].
pub struct Shared {
    store: StoreReader,
    keyspace: KeySpaceCell,
    /// The fleet's topology in cluster mode (issue 17); empty otherwise.
    topology: TopologyCell,
    /// False while the replication stream is down or lags past the bound: every lookup then goes
    /// to the origin (bypass) so no hit can be older than the bound.
    serve_hits: AtomicBool,
    replication: ReplicationGauge,
    lanes: Vec<CoreLanes>,
    stats: Vec<CoreStats>,
    control_wakers: ControlWakers,
    /// Each core's waker, set by the core when it starts; the control side calls it after
    /// sending a reply.
    core_wakers: Vec<OnceLock<Arc<dyn Wake>>>,
    started_at: Instant,
    next_client_id: AtomicU64,
    /// Which transport the cores run (`kernel`, `userspace`), set when the engine starts.
    transport: OnceLock<&'static str>,
    /// The relay, for cores that run it on their own thread.
    pg_host: OnceLock<Arc<dyn PgHost>>,
    /// Per core: it drains its own PostgreSQL requests (set by the core before its first turn).
    pg_hosted: Vec<AtomicBool>,
    /// Per core: client-tracking invalidations for it (issue 18, [`tracking`]).
    tracking: Vec<tracking::TrackingLane>,
}

impl Shared {
    pub fn new(
        store: StoreReader,
        keyspace: KeySpaceCell,
        cores: usize,
        queue_capacity: usize,
        control_wakers: ControlWakers,
    ) -> Self {
        Shared {
            store,
            keyspace,
            topology: TopologyCell::default(),
            serve_hits: AtomicBool::new(false),
            replication: ReplicationGauge::default(),
            lanes: (0..cores).map(|_| CoreLanes::new(queue_capacity)).collect(),
            stats: (0..cores).map(|_| CoreStats::default()).collect(),
            control_wakers,
            core_wakers: (0..cores).map(|_| OnceLock::new()).collect(),
            started_at: Instant::now(),
            next_client_id: AtomicU64::new(0),
            transport: OnceLock::new(),
            pg_host: OnceLock::new(),
            pg_hosted: (0..cores).map(|_| AtomicBool::new(false)).collect(),
            tracking: (0..cores).map(|_| tracking::TrackingLane::new()).collect(),
        }
    }

    /// Core `core`'s port. The engine takes one per core; a harness standing in for a core
    /// may take it instead (one receiver per core: never both).
    ///
    /// # Panics
    /// When `core` is not below [`Shared::cores`] (a wiring mistake, not an input).
    pub fn core_port(self: &Arc<Self>, core: usize) -> CorePort {
        assert!(core < self.cores(), "core {core} of {}", self.cores());
        CorePort::new(self.clone(), core)
    }

    /// The control side's port (any number of holders).
    pub fn control_port(self: &Arc<Self>) -> ControlPort {
        ControlPort::new(self.clone())
    }

    pub fn cores(&self) -> usize {
        self.lanes.len()
    }

    /// A connection of core `core` starts tracking keys: from now on the writer queues
    /// invalidations for that core. Call before reading the store for it (see [`tracking`]'s
    /// ordering).
    pub fn tracking_enter(&self, core: usize) {
        if let Some(lane) = self.tracking.get(core) {
            lane.enter();
        }
    }

    /// A connection counted by [`Shared::tracking_enter`] stopped tracking (off, reset, closed).
    pub fn tracking_leave(&self, core: usize) {
        if let Some(lane) = self.tracking.get(core) {
            lane.leave();
        }
    }

    /// Connections of core `core` with tracking on.
    pub fn tracking_clients(&self, core: usize) -> usize {
        self.tracking.get(core).map_or(0, |l| l.clients())
    }

    /// The core whose connection has client id `id` (ids are handed out per core, interleaved:
    /// `CorePort::next_client_id`).
    pub fn core_of_client(&self, id: u64) -> Option<usize> {
        let core = usize::try_from(id.checked_sub(1)? % self.cores() as u64).ok()?;
        Some(core)
    }

    /// Whether client id `id` has been handed out (its connection may have closed since).
    pub fn client_id_issued(&self, id: u64) -> bool {
        id.checked_sub(1).is_some_and(|n| {
            n / (self.cores() as u64) < self.next_client_id.load(Ordering::Relaxed)
        })
    }

    /// The store's read side.
    pub fn store(&self) -> &StoreReader {
        &self.store
    }

    /// The key space the cores resolve keys with.
    pub fn keyspace(&self) -> &KeySpaceCell {
        &self.keyspace
    }

    /// The cluster topology the cores route keys with (`None` inside: cluster mode off).
    pub fn topology(&self) -> &TopologyCell {
        &self.topology
    }

    /// Whether hits may be served (stream up, lag under the bound).
    pub fn serve_hits(&self) -> bool {
        self.serve_hits.load(Ordering::Acquire)
    }

    /// What the control plane last published about replication.
    pub fn replication(&self) -> &ReplicationGauge {
        &self.replication
    }

    /// Core `core`'s counters.
    ///
    /// # Panics
    /// When `core` is not below [`Shared::cores`].
    pub fn stats(&self, core: usize) -> &CoreStats {
        &self.stats[core]
    }

    /// Every core's counters, core 0 first.
    pub fn all_stats(&self) -> &[CoreStats] {
        &self.stats
    }

    /// Sum of one counter over all cores.
    pub fn total(&self, counter: impl Fn(&CoreStats) -> &AtomicU64) -> u64 {
        self.stats
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .sum()
    }

    /// Messages waiting in core `core`'s lanes.
    pub fn queue_depths(&self, core: usize) -> QueueDepths {
        let l = &self.lanes[core];
        QueueDepths {
            misses: l.misses.len(),
            replies: l.replies.len(),
            pg_requests: l.pg_requests.len(),
            pg_replies: l.pg_replies.len(),
            capacity: l.misses.capacity(),
        }
    }

    /// Time since the plane was made (the node's start).
    pub fn uptime(&self) -> Duration {
        self.started_at.elapsed()
    }

    /// The transport the cores run (`kernel` until the engine says otherwise).
    pub fn transport(&self) -> &'static str {
        self.transport.get().copied().unwrap_or("kernel")
    }

    /// Wakes core `core` (a reply waits, or the engine stops).
    pub(crate) fn wake_core(&self, core: usize) {
        if let Some(waker) = self.core_wakers.get(core).and_then(|w| w.get()) {
            waker.wake();
        }
    }
}
