//! The WAL consumer: keeps the cache coherent by tailing the origin's WAL.
//!
//! Purpose: stream committed changes of the published tables from a permanent logical slot
//! (`pgoutput`, the highest protocol the origin speaks: 4 on PostgreSQL 16+, 3 on 15, 2 on 14,
//! else 1; `streaming 'on'` from protocol 2) and hand them, one whole transaction at a time and
//! in commit order, to the store writer as [`WalEvent`]s. Not on the hit path: it runs as one tokio task in the
//! control plane ([`run_consumer`]).
//!
//! ```text
//! origin walsender ──CopyBoth──▶ conn::ReplicationConn ──XLogData──▶ pgoutput::parse_message
//!        ▲                                                                   │
//!        │ Standby Status Update (flush = applied_lsn)          Begin..Commit → WalTxn
//!        │                                                                   ▼
//!   consumer task ◀── state.applied_lsn ◀── store writer ◀── mpsc<WalEvent> (Txn/Progress/Reset)
//! ```
//!
//! Invariants:
//! - **Feedback never runs ahead of the cache.** The slot's `confirmed_flush_lsn` is moved only
//!   by the `flush` field of status updates, and that is always `state.applied_lsn`, which the
//!   store writer sets after applying. So after any crash or disconnect the server re-sends
//!   every change the cache has not applied. (`write` reports what was received.)
//! - A [`WalTxn`] is delivered only when its Commit (or Stream Commit) arrives; a connection
//!   lost mid-transaction discards the partial transaction, and the server re-sends it whole.
//! - Streamed (in-progress) transactions are buffered per top-level xid until Stream Commit;
//!   a subtransaction's abort cuts the buffer at that subtransaction's first change, a
//!   top-level abort drops it. Nothing of an uncommitted transaction reaches the writer.
//! - Memory bound: the changes buffered over every open transaction (Begin…Commit and
//!   streamed) stay under [`WalConfig::max_txn_memory`] (estimated bytes). Past it the largest
//!   transaction *overflows*: its row changes are dropped, only the tables it touches (and its
//!   Relation messages) are kept, and at commit it is delivered as those Relations plus one
//!   [`Change::Invalidate`], which the writer applies like a TRUNCATE of those tables (entries
//!   out, leases voided, result-cache answers dropped). No stale entry survives it.
//! - A transaction whose `end_lsn <= state.applied_lsn` is a re-delivery and is skipped here.
//! - [`WalEvent::Progress`] is sent only between transactions, so `lsn` never splits one.
//! - If the slot vanished after we had streamed from it, the consumer re-creates it and sends
//!   [`WalEvent::Reset`] before anything else: changes were lost, the cache must be flushed.
//! - Failover (a reconnect to another server, told by `IDENTIFY_SYSTEM`): the cache is kept only
//!   if the slot is there and usable and nothing applied lies past the point where the old
//!   timeline ended (`TIMELINE_HISTORY`); otherwise [`WalEvent::Reset`], whose `lsn` (the restart
//!   point, possibly below the old `applied_lsn`) the writer stores into `applied_lsn` before
//!   the consumer streams on. A kept cache is told [`WalEvent::Failover`] with the fork point
//!   before anything of the new timeline, so that the writer drops what fills read on the old
//!   primary past it. See `docs/consistency.md`, "Failover".
//!
//! Thread model: one task; [`ReplicationState`] is shared, all atomics, read by metrics/REST and
//! the serving layer, written by this task except `applied_lsn` / `applied_commit_ts_us`
//! (store writer). Timestamps in this module are microseconds since the Unix epoch.
//!
//! Limitations:
//! - A Relation message outside a transaction (pgoutput 1 does not send one, but the format
//!   allows it) is delivered as a `WalTxn` with `xid = 0`, `commit_lsn = end_lsn = 0` and one
//!   `Change::Relation`: appliers must not move `applied_lsn` backwards (take the max).
//! - Backpressure: while the store writer does not take events, the socket is not read; past
//!   the origin's `wal_sender_timeout` the origin drops us and we reconnect and resume.
//! - `Progress` is sent with `try_send` and skipped when the channel is full (the next
//!   keepalive supersedes it), so a slow applier never stalls the stream on Progress alone.
//! - Type, Origin and logical-decoding Message messages are ignored.
//! - The memory bound counts an estimate (wire bytes of each message plus the decoded vectors),
//!   not the allocator's figure.

#![deny(unsafe_code)]

pub mod conn;
mod consumer;
mod error;
pub mod pgoutput;
pub mod slot;
mod txnbuf;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

pub use conn::{ReplicationConn, ReplicationEvent, SystemInfo};
pub use consumer::{run_consumer, run_consumer_from};
pub use error::WalError;
pub use pgoutput::{DecodeError, RelColumn, Relation, TupleValue};
pub use slot::PublicationScope;

/// Default interval between Standby Status Updates.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Default idle time after which the consumer asks the server for a keepalive.
pub const DEFAULT_KEEPALIVE_REQUEST_INTERVAL: Duration = Duration::from_millis(100);
/// Default pause before reconnecting after an error.
pub const DEFAULT_RECONNECT_BACKOFF: Duration = Duration::from_secs(1);
/// Default bound on the changes buffered for open transactions (64 MiB).
pub const DEFAULT_MAX_TXN_MEMORY: usize = 64 << 20;

/// Settings of the WAL consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalConfig {
    /// Logical replication slot (created with `pgoutput` if missing).
    pub slot: String,
    /// Publication to stream (created if missing).
    pub publication: String,
    /// What the publication covers when the consumer creates or extends it.
    pub publication_scope: PublicationScope,
    /// Standby Status Updates are sent at least this often.
    pub status_interval: Duration,
    /// When nothing arrived for this long outside a transaction, ask the server for a
    /// keepalive, so that `applied_lsn` can advance past WAL of unrelated tables.
    pub keepalive_request_interval: Duration,
    /// Pause between a failed session and the next connection attempt.
    pub reconnect_backoff: Duration,
    /// Bound on the (estimated) bytes of changes buffered over all open transactions; past
    /// it the largest one overflows into a table flush at commit (see the module docs).
    pub max_txn_memory: usize,
}

impl WalConfig {
    /// A config with the default intervals.
    pub fn new(slot: &str, publication: &str, publication_scope: PublicationScope) -> WalConfig {
        WalConfig {
            slot: slot.to_owned(),
            publication: publication.to_owned(),
            publication_scope,
            status_interval: DEFAULT_STATUS_INTERVAL,
            keepalive_request_interval: DEFAULT_KEEPALIVE_REQUEST_INTERVAL,
            reconnect_backoff: DEFAULT_RECONNECT_BACKOFF,
            max_txn_memory: DEFAULT_MAX_TXN_MEMORY,
        }
    }

    /// Checks names and intervals.
    pub fn validate(&self) -> Result<(), WalError> {
        let slot_ok = !self.slot.is_empty()
            && self.slot.len() < 64
            && self
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !slot_ok {
            return Err(WalError::Config(format!(
                "slot name {:?}: use 1-63 of [a-z0-9_]",
                self.slot
            )));
        }
        if self.publication.is_empty() || self.publication.contains('\0') {
            return Err(WalError::Config(
                "publication name is empty or has NUL".into(),
            ));
        }
        if self.status_interval.is_zero()
            || self.keepalive_request_interval.is_zero()
            || self.reconnect_backoff.is_zero()
        {
            return Err(WalError::Config(
                "WAL consumer intervals must be > 0".into(),
            ));
        }
        Ok(())
    }
}

/// Replication progress, shared between the consumer, the store writer and observers.
#[derive(Debug, Default)]
pub struct ReplicationState {
    /// A replication connection is open.
    pub connected: AtomicBool,
    /// The connection is in CopyBoth (streaming) mode.
    pub streaming: AtomicBool,
    /// Highest WAL position received from the server.
    pub received_lsn: AtomicU64,
    /// Highest WAL position the server reported having sent (keepalive / XLogData).
    pub server_wal_end: AtomicU64,
    /// Set by the store writer: everything up to here is in the cache.
    pub applied_lsn: AtomicU64,
    /// Set by the store writer: commit time of the last applied transaction.
    pub applied_commit_ts_us: AtomicI64,
    /// Server clock in the last keepalive.
    pub last_server_time_us: AtomicI64,
    /// Set by the consumer: last time `applied_lsn >= server_wal_end` was observed while
    /// streaming (checked every keepalive request interval).
    pub caught_up_at_us: AtomicI64,
    /// Connection attempts after the first.
    pub reconnects: AtomicU64,
    /// Times the slot was found missing and re-created (each sent a [`WalEvent::Reset`]).
    pub resets: AtomicU64,
    /// Transactions delivered.
    pub txns: AtomicU64,
    /// Row changes delivered.
    pub changes: AtomicU64,
    /// Estimated bytes of changes buffered for open (Begin…Commit and streamed) transactions.
    pub buffered_bytes: AtomicU64,
    /// Highest `buffered_bytes` seen since start.
    pub buffered_peak_bytes: AtomicU64,
    /// Transactions that went past `max_txn_memory` and were delivered as table flushes.
    pub txn_overflows: AtomicU64,
    /// pgoutput protocol version of the current (or last) session; 0 before the first.
    pub proto_version: AtomicU64,

    /// Times the stream resumed on a different server: a new timeline (a promoted standby) or
    /// a different cluster.
    pub failovers: AtomicU64,
    /// Failovers that flushed the cache (slot not synced to the new primary, or WAL applied
    /// past the new timeline's switch point, or a different cluster).
    pub failover_flushes: AtomicU64,
    /// Last failover: stream lost → streaming on the new server and caught up with it, ms.
    pub last_failover_gap_ms: AtomicU64,
    /// Whether the last failover flushed the cache.
    pub last_failover_flushed: AtomicBool,
    /// The slot is a failover slot (PostgreSQL 17+, synchronized to standbys).
    pub slot_failover: AtomicBool,
    /// With `replication.url` on a standby: its replay delay behind its primary, ms (checked
    /// at every status update); 0 when streaming from the primary.
    pub standby_replay_lag_ms: AtomicU64,
}

impl ReplicationState {
    /// Bytes of WAL the server has sent past what is applied.
    pub fn lag_bytes(&self) -> u64 {
        let end = self.server_wal_end.load(Ordering::Acquire);
        end.saturating_sub(self.applied_lsn.load(Ordering::Acquire))
    }

    /// How stale the cache may be, in ms: 0 while streaming with `applied >= server_wal_end`
    /// (plus, when tailing a standby, the standby's replay delay);
    /// otherwise the time since the cache was last known to be current (the later of the last
    /// observed catch-up and the last applied commit). While not streaming it keeps growing,
    /// so a lost connection never looks like "no lag".
    ///
    /// Accepted race: the fields are read one by one, not as a snapshot; the error is bounded
    /// by one keepalive request interval.
    pub fn lag_ms(&self, now_us: i64) -> u64 {
        // Tailing a standby: the stream itself is that far behind the primary.
        let standby = self.standby_replay_lag_ms.load(Ordering::Acquire);
        let streaming = self.streaming.load(Ordering::Acquire);
        if streaming && self.lag_bytes() == 0 {
            return standby;
        }
        let current_at = self
            .caught_up_at_us
            .load(Ordering::Acquire)
            .max(self.applied_commit_ts_us.load(Ordering::Acquire));
        u64::try_from(now_us.saturating_sub(current_at) / 1000)
            .unwrap_or(0)
            .saturating_add(standby)
    }
}

/// A committed transaction, in commit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalTxn {
    pub xid: u32,
    /// LSN of the commit record.
    pub commit_lsn: u64,
    /// End of the commit record: applying this txn means `applied_lsn = end_lsn`.
    pub end_lsn: u64,
    /// Commit time, microseconds since the Unix epoch.
    pub commit_ts_us: i64,
    pub changes: Vec<Change>,
}

/// One change inside a transaction; `rel` is the relation id of an earlier `Relation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A (new or changed) table schema; applies to the changes that follow.
    Relation(Relation),
    Insert {
        rel: u32,
        new: Vec<TupleValue>,
    },
    /// `old_key` is set when the key changed (`'K'`) or with `REPLICA IDENTITY FULL` (`'O'`).
    Update {
        rel: u32,
        old_key: Option<Vec<TupleValue>>,
        new: Vec<TupleValue>,
    },
    Delete {
        rel: u32,
        old_key: Vec<TupleValue>,
    },
    Truncate {
        rels: Vec<u32>,
    },
    /// The transaction changed these tables, but its row changes were too many to buffer
    /// (`max_txn_memory`): drop everything cached of them, as for a TRUNCATE.
    Invalidate {
        rels: Vec<u32>,
    },
}

/// What the consumer hands to the store writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalEvent {
    Txn(WalTxn),
    /// Everything up to `lsn` was sent and delivered: applying it means `applied_lsn = lsn`.
    Progress {
        lsn: u64,
    },
    /// The slot was missing and has been re-created, or the stream moved to a server that
    /// lacks WAL the cache has applied: changes were lost, flush the cache. The stream restarts
    /// at `lsn`: applying the reset means `applied_lsn = lsn` (possibly lower than before, on
    /// a new timeline).
    Reset {
        reason: String,
        lsn: u64,
    },
    /// The stream moved to a promoted standby and the cache is kept: its timeline forked from
    /// the old one at `fork`. Rows read on the old primary past it must go (the writer's
    /// `ahead` module). Sent before anything of the new timeline.
    Failover {
        fork: u64,
    },
}
