//! Client-tracking invalidations from the store writer to the cores (issue 18).
//!
//! The writer applies the WAL; once a transaction's changes are in the store it tells every core
//! that has tracking clients which rows changed ([`Invalidation::Key`]), which tables were
//! dropped or truncated ([`Invalidation::Table`]), or that everything must be forgotten
//! ([`Invalidation::All`]: a flush, a lost stream). Each core matches them against its own
//! tracking table and pushes `invalidate` messages to its clients (`engine::tracking`). A core
//! also forwards an invalidation meant for a redirect target on another core through that core's
//! queue ([`Invalidation::Deliver`]); a target found gone is reported back the same way
//! ([`Invalidation::RedirectBroken`]).
//!
//! # Bounds and loss
//! Each core's queue is bounded ([`QUEUE_CAPACITY`]). A push that does not fit is not retried:
//! the core's `overflow` flag is raised instead, and at its next turn the core sends a null
//! invalidation (forget everything) to all its tracking clients. Nothing is ever lost silently.
//!
//! # Ordering
//! A core raises its `active` count before it answers `CLIENT TRACKING ON` and before it reads
//! any key for a tracking client; the writer loads it after a transaction's changes are in the
//! store, with a SeqCst fence on both sides, so a read of the old value is always followed by the
//! invalidation (the store-buffering pattern: both parties write, fence, then read the other's).
//! Nothing is queued to a core without tracking clients.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

use crossbeam_queue::ArrayQueue;

/// Invalidations one core's queue holds before it overflows into a null invalidation.
pub const QUEUE_CAPACITY: usize = 16 * 1024;

/// What changed, as the writer (or another core) tells a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// The row `pk` of table `table` changed (insert, update, delete, either key of an update).
    Key { table: u32, pk: Box<[u8]> },
    /// Every row of a table may have changed (truncate, drop, relation change, evicted table).
    Table(u32),
    /// Everything may have changed (flush, lost stream, lag past the bound).
    All,
    /// A message for redirect target `client` on this core, from tracking client `from` on
    /// another core: the key to invalidate, or `None` for everything.
    Deliver {
        client: u64,
        key: Option<Box<[u8]>>,
        from: u64,
    },
    /// Tracking client `client` on this core redirects to `target`, which another core found
    /// gone: its redirect is broken.
    RedirectBroken { client: u64, target: u64 },
}

/// One core's end of the tracking channel.
pub(super) struct TrackingLane {
    queue: ArrayQueue<Invalidation>,
    overflow: AtomicBool,
    /// Connections on this core that track keys or receive redirected invalidations.
    active: AtomicUsize,
}

impl TrackingLane {
    pub(super) fn new() -> Self {
        TrackingLane {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            overflow: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        }
    }

    /// Whether the core has tracking clients (after the writer's fence).
    pub(super) fn active(&self) -> bool {
        self.active.load(Ordering::SeqCst) > 0
    }

    /// Queues `inv`; on a full queue raises the overflow flag (a null invalidation follows).
    pub(super) fn push(&self, inv: Invalidation) {
        if self.queue.push(inv).is_err() {
            self.overflow.store(true, Ordering::Release);
        }
    }

    /// Something waits: an invalidation or an overflow.
    pub(super) fn waiting(&self) -> bool {
        !self.queue.is_empty() || self.overflow.load(Ordering::Acquire)
    }

    pub(super) fn pop(&self) -> Option<Invalidation> {
        self.queue.pop()
    }

    /// Whether the queue overflowed since the last call (clears the flag).
    pub(super) fn take_overflow(&self) -> bool {
        self.overflow.load(Ordering::Relaxed) && self.overflow.swap(false, Ordering::AcqRel)
    }

    /// One more tracking connection on this core; visible to the writer before the caller reads
    /// the store for it.
    pub(super) fn enter(&self) {
        self.active.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub(super) fn clients(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    pub(super) fn leave(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The writer's fence before it reads the cores' `active` counts (see the module's ordering).
pub(super) fn writer_fence() {
    fence(Ordering::SeqCst);
}
