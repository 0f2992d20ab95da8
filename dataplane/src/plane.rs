//! The typed boundary between the dataplane cores and the control plane.
//!
//! Cores never talk to the origin. A lookup that misses (or any lookup while hits are not
//! allowed, see [`Shared::serve_hits`]) becomes a [`MissRequest`] on the core's bounded
//! lock-free queue to the control plane; the answer comes back as a [`MissReply`] on the core's
//! own reply queue, and the core's waker ends its sleep. Both queues are `crossbeam_queue`
//! `ArrayQueue`s: a full queue is an immediate, explicit "busy" error to the client, never a
//! blocked core.
//!
//! Everything else the control plane needs to see of the cores is in [`CoreStats`] (plain
//! relaxed counters, one struct per core) and everything the cores need to see of the control
//! plane is in [`Shared`] (the store reader, the key space, the replication gauge).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;

use crate::keyspace::KeySpaceCell;
use crate::store::StoreReader;

/// One key a core could not answer from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissKey {
    pub table: u32,
    pub pk: Box<[u8]>,
}

/// Keys of one request that need the origin.
#[derive(Debug)]
pub struct MissRequest {
    pub core: usize,
    /// Identifies the connection (slot and generation) on its core.
    pub conn: u64,
    /// Identifies the pending reply on that connection.
    pub seq: u64,
    pub keys: Vec<MissKey>,
    /// Read the origin but install nothing: hits are currently not allowed (lag, lost stream).
    pub bypass: bool,
}

/// A row fetched for a miss, encoded exactly as the store would hold it.
#[derive(Debug, PartialEq, Eq)]
pub struct RowBytes {
    /// [`crate::row::SECTION_RESP_JSON`]
    pub resp_json: Vec<u8>,
    /// [`crate::row::SECTION_COLUMNS`]
    pub columns: Vec<u8>,
}

/// The outcome for one [`MissKey`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FillResult {
    Row(Arc<RowBytes>),
    Absent,
    /// The origin could not answer; the text goes to the client after `-ERR `.
    Error(Arc<str>),
}

/// The control plane's answer to one [`MissRequest`], results in the order of its keys.
#[derive(Debug)]
pub struct MissReply {
    pub conn: u64,
    pub seq: u64,
    pub results: Vec<FillResult>,
}

/// What a PostgreSQL-protocol request asks of the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgRequestKind {
    /// `messages` is the client's StartupMessage (length word included). The control plane
    /// opens an origin connection as that user and database and relays the authentication
    /// exchange; replies end with [`PgReplyEnd::Auth`] while the client must send a password
    /// message, and with [`PgReplyEnd::Ready`] once the session is open. The final reply holds
    /// the origin's ParameterStatus messages, pgline's own BackendKeyData for this session and
    /// ReadyForQuery.
    Startup,
    /// `messages` is one or more password/SASL (`p`) messages during startup.
    Auth,
    /// `messages` is a run of complete frontend messages the core does not serve itself, in the
    /// client's order, ending with a Sync or a Query (or Flush/Terminate-free: the core never
    /// forwards Terminate). Statement names are the client's; the control plane maps them to
    /// its backends. A statement referenced here but parsed only in a batch the core served
    /// itself is preceded by that Parse message, so the control plane always knows it.
    Batch,
    /// The client went away; release the session's backend (rolled back if it was in a
    /// transaction) and forget the session. No reply.
    Close,
    /// `messages` is a CancelRequest (16 bytes) that arrived on a new connection of any core.
    /// No reply; the core closes that connection itself.
    Cancel,
}

/// A PostgreSQL-protocol request from a core to the control plane.
#[derive(Debug)]
pub struct PgRequest {
    pub core: usize,
    /// Identifies the connection (slot and generation) on its core.
    pub conn: u64,
    /// Identifies the reply on that connection; replies to one request share its `seq`.
    pub seq: u64,
    /// The session: the connection's client id (unique for the process lifetime).
    pub session: u64,
    pub kind: PgRequestKind,
    /// Raw frontend messages, see [`PgRequestKind`].
    pub messages: Vec<u8>,
    /// A `Batch` the query-result cache may keep: its one statement's answer is cacheable under
    /// this key when the batch runs with the session idle (see [`ResultPlane`]).
    pub cache: Option<Box<ResultKey>>,
    /// Sent with `Startup` only: the session's flow control (see [`PgFlow`]).
    pub flow: Option<Arc<PgFlow>>,
}

/// How far the control plane may run ahead of a client reading a relayed answer: it stops
/// sending chunks while more than this many bytes are queued for the client or in flight to
/// its core (so a slow reader of a huge result costs pgline this much memory, not the result).
pub const PG_FLOW_WINDOW: u64 = 4 << 20;

/// Flow control of one PostgreSQL session's relayed replies, shared by its core and the
/// control plane. Bytes the control plane sent and the core has not yet appended, plus what
/// the connection still has to write, are `sent - applied + backlog`.
#[derive(Debug, Default)]
pub struct PgFlow {
    /// Reply bytes the control plane has pushed for this session (control plane only).
    pub sent: AtomicU64,
    /// Reply bytes the core has appended to the connection's output (core only).
    pub applied: AtomicU64,
    /// The connection's output not yet written to the client, as of the core's last visit
    /// (core only).
    pub backlog: AtomicU64,
    /// The connection is gone: nothing will be read any more (core only).
    pub closed: AtomicBool,
}

impl PgFlow {
    /// Bytes sent to the client's core that the client has not read yet.
    pub fn outstanding(&self) -> u64 {
        // Counters only, no data published through them: Relaxed.
        let sent = self.sent.load(Ordering::Relaxed);
        let applied = self.applied.load(Ordering::Relaxed);
        sent.saturating_sub(applied) + self.backlog.load(Ordering::Relaxed)
    }
}

/// How a [`PgReply`] chunk ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgReplyEnd {
    /// More chunks for the same `seq` follow (large results are streamed in bounded chunks).
    More,
    /// Startup: the client must answer with a password/SASL message.
    Auth,
    /// The request is complete and the session is ready: `bytes` ends with ReadyForQuery
    /// carrying this transaction status (`b'I'`, `b'T'` or `b'E'`).
    Ready(u8),
    /// Fatal: write `bytes` (an ErrorResponse) and close the connection.
    Close,
}

/// The control plane's answer (or one chunk of it) to a [`PgRequest`].
#[derive(Debug)]
pub struct PgReply {
    pub conn: u64,
    pub seq: u64,
    /// Backend messages to write to the client as they are.
    pub bytes: Vec<u8>,
    pub end: PgReplyEnd,
    /// Session consistency fence: when non-zero, the origin's WAL position after this request
    /// (taken after a write committed, or after a read the origin served). The session may be
    /// served from cache again only once the applied LSN has reached it.
    pub fence_lsn: u64,
    /// On a reply that ends [`PgReplyEnd::Ready`]: the origin session state this session now
    /// has was read from the origin after the request (identity: session user and current
    /// role; name resolution: the resolved search path and temporary objects; unreported
    /// output settings) and is the one cached answers were made under. False whenever that is
    /// not known, so the session is not served from cache until a later reply says so.
    pub serve_cached: bool,
}

/// Wakes a sleeping party (a core's poll loop, or the control plane's miss dispatcher).
pub trait Wake: Send + Sync {
    fn wake(&self);
}

/// The queues of one core.
pub struct CoreQueues {
    pub misses: ArrayQueue<MissRequest>,
    pub replies: ArrayQueue<MissReply>,
    /// PostgreSQL-protocol work this core hands the control plane.
    pub pg_requests: ArrayQueue<PgRequest>,
    /// The control plane's PostgreSQL-protocol replies to this core.
    pub pg_replies: ArrayQueue<PgReply>,
}

impl CoreQueues {
    pub fn new(capacity: usize) -> Self {
        CoreQueues {
            misses: ArrayQueue::new(capacity.max(1)),
            replies: ArrayQueue::new(capacity.max(1)),
            pg_requests: ArrayQueue::new(capacity.max(1)),
            pg_replies: ArrayQueue::new(capacity.max(1)),
        }
    }
}

/// Per-core counters, written only by their core with relaxed stores, read by anyone.
#[derive(Debug, Default)]
pub struct CoreStats {
    pub connections_accepted: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub connections_closed: AtomicU64,
    pub connections_open: AtomicU64,
    pub commands: AtomicU64,
    pub keys_hit: AtomicU64,
    pub keys_negative_hit: AtomicU64,
    pub keys_miss: AtomicU64,
    pub keys_unknown_table: AtomicU64,
    pub keys_bypass: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub miss_queue_full: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub polls: AtomicU64,
    /// Service time of the turns that executed requests, one observation per request.
    pub service_time: LatencyHistogram,
    /// Userspace transport only: the core's stack counters, published every few hundred turns.
    pub net_rx_frames: AtomicU64,
    pub net_tx_frames: AtomicU64,
    pub net_rx_dropped: AtomicU64,
    pub net_tx_dropped: AtomicU64,
    pub net_tcp_retransmits: AtomicU64,
    /// Connection bounds (`engine::limits`): PostgreSQL-port connections open (gauge; the
    /// RESP ones are `connections_open` minus these).
    pub connections_open_pg: AtomicU64,
    /// Refused because their source address had its limit open (also in `connections_rejected`).
    pub connections_rejected_source: AtomicU64,
    /// Closed: not authenticated (RESP) or startup not done (PostgreSQL) in time.
    pub connections_auth_timeout: AtomicU64,
    /// Closed: idle past the idle timeout.
    pub connections_idle_timeout: AtomicU64,
    /// Closed: the core was at its reply-memory cap and they held the most unwritten output.
    pub connections_evicted: AtomicU64,
    /// Closed: too many wrong passwords.
    pub connections_auth_failures: AtomicU64,
    /// Wrong passwords (AUTH, HELLO ... AUTH) over RESP.
    pub auth_failures: AtomicU64,
    /// Buffer bytes the core's connections hold beyond their initial buffers (gauge).
    pub reply_memory_bytes: AtomicU64,
}

impl CoreStats {
    /// Adds `n` to a counter owned by this core (single writer: load + store, no RMW).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

/// Upper bounds of the [`LatencyHistogram`] buckets, in nanoseconds (1-2-5 steps, 1 us to
/// 100 ms); a last, implicit bucket takes everything slower.
pub const LATENCY_BOUNDS_NS: [u64; 16] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
];

/// A fixed-bucket latency histogram of plain atomics, written by one core only.
///
/// Recording is a few comparisons plus relaxed load/store pairs (no read-modify-write, no
/// allocation). Readers see each bucket atomically but not all buckets at one instant: a scrape
/// may see `sum_ns` one observation ahead of or behind the buckets, which Prometheus tolerates.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per-bucket (not cumulative) counts; index `i` counts observations `<= LATENCY_BOUNDS_NS[i]`
    /// and above the previous bound; the last index counts the rest.
    pub buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    /// Sum of all observations, in nanoseconds.
    pub sum_ns: AtomicU64,
}

impl LatencyHistogram {
    /// Records `n` observations of `ns` nanoseconds each. Single writer only.
    #[inline]
    pub fn record(&self, ns: u64, n: u64) {
        let i = LATENCY_BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(LATENCY_BOUNDS_NS.len());
        CoreStats::add(&self.buckets[i], n);
        CoreStats::add(&self.sum_ns, ns.saturating_mul(n));
    }

    /// A copy of the per-bucket counts and the sum.
    pub fn snapshot(&self) -> ([u64; LATENCY_BOUNDS_NS.len() + 1], u64) {
        let mut out = [0u64; LATENCY_BOUNDS_NS.len() + 1];
        for (o, b) in out.iter_mut().zip(self.buckets.iter()) {
            *o = b.load(Ordering::Relaxed);
        }
        (out, self.sum_ns.load(Ordering::Relaxed))
    }
}

/// What the control plane tells the cores (and `INFO`) about replication.
#[derive(Debug, Default)]
pub struct ReplicationGauge {
    pub streaming: AtomicBool,
    pub applied_lsn: AtomicU64,
    pub lag_bytes: AtomicU64,
    pub lag_ms: AtomicU64,
}

/// Read-mostly state shared by all cores.
pub struct Shared {
    pub store: StoreReader,
    pub keyspace: KeySpaceCell,
    /// False while the replication stream is down or lags past the bound: every lookup then goes
    /// to the origin (bypass) so no hit can be older than the bound.
    pub serve_hits: AtomicBool,
    pub replication: ReplicationGauge,
    pub queues: Vec<CoreQueues>,
    pub stats: Vec<CoreStats>,
    pub control_waker: Arc<dyn Wake>,
    /// Each core's waker, set by the core when it starts; the control plane calls it after
    /// pushing a reply.
    pub core_wakers: Vec<std::sync::OnceLock<Arc<dyn Wake>>>,
    pub started_at: std::time::Instant,
    pub next_client_id: AtomicU64,
    /// Which transport the cores run (`kernel`, `userspace`), set when the engine starts.
    pub transport: std::sync::OnceLock<&'static str>,
    /// The query-result cache's leases and landed answers (control plane only; cores never
    /// touch it).
    pub results: Arc<ResultPlane>,
}

impl Shared {
    pub fn new(
        store: StoreReader,
        keyspace: KeySpaceCell,
        cores: usize,
        queue_capacity: usize,
        control_waker: Arc<dyn Wake>,
    ) -> Self {
        Shared {
            store,
            keyspace,
            serve_hits: AtomicBool::new(false),
            replication: ReplicationGauge::default(),
            queues: (0..cores)
                .map(|_| CoreQueues::new(queue_capacity))
                .collect(),
            stats: (0..cores).map(|_| CoreStats::default()).collect(),
            control_waker,
            core_wakers: (0..cores).map(|_| std::sync::OnceLock::new()).collect(),
            started_at: std::time::Instant::now(),
            next_client_id: AtomicU64::new(1),
            transport: std::sync::OnceLock::new(),
            results: Arc::new(ResultPlane::default()),
        }
    }

    /// Wakes core `core` (after a reply was pushed to its queue).
    pub fn wake_core(&self, core: usize) {
        if let Some(waker) = self.core_wakers.get(core).and_then(|w| w.get()) {
            waker.wake();
        }
    }

    pub fn cores(&self) -> usize {
        self.queues.len()
    }

    /// Sum of one counter over all cores.
    pub fn total(&self, counter: impl Fn(&CoreStats) -> &AtomicU64) -> u64 {
        self.stats
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .sum()
    }
}

// ---- query-result cache ---------------------------------------------------------------

/// The store table id under which query results are kept. No cached table has it in
/// practice: PostgreSQL's OID counter would have to reach its last two values. The result
/// index ignores row changes of a relation with this id (a table with that OID would not be
/// cached correctly: a known, accepted gap).
pub const RESULTS_TABLE: u32 = u32::MAX - 1;

/// Largest answer (RowDescription, DataRows, CommandComplete) the result cache keeps.
pub const RESULT_MAX_BYTES: usize = 256 * 1024;

/// `(table id, column index in the table's columns, canonical value text)`: a top-level
/// `column = value` predicate of a cached query.
pub type ResultEquality = (u32, u16, Box<[u8]>);

/// What a core knows of a cacheable statement it forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultKey {
    /// 64-bit hash of `key`; the store key is its 8 big-endian bytes.
    pub hash: u64,
    /// The full key (normalized text, parameter types and values, lifted literals), kept in
    /// the entry so that a hash collision reads as a miss.
    pub key: Box<[u8]>,
    /// Tables read (ids), sorted.
    pub tables: Box<[u32]>,
    /// Top-level equalities, at most one per table.
    pub equalities: Box<[ResultEquality]>,
}

impl ResultKey {
    pub fn store_key(&self) -> [u8; 8] {
        self.hash.to_be_bytes()
    }
}

/// A landed answer for the writer to install (or refuse).
#[derive(Debug)]
pub struct ResultFill {
    pub key: Box<ResultKey>,
    /// RowDescription, DataRow*, CommandComplete exactly as the origin sent them.
    pub bytes: Vec<u8>,
    /// `pg_current_snapshot()::text` taken on the same backend right before the statement.
    pub snapshot: String,
    pub lease: ResultLease,
}

/// Leases of the result cache: per table an epoch, bumped by the writer for every WAL change
/// it applies to the table. A relay takes a lease (the epochs of the tables read) before it
/// sends a cacheable statement; the writer installs the answer only if the epochs are
/// unchanged. Outstanding lease ids tell the writer which snapshots may still land (for
/// pruning its applied-xid records).
#[derive(Debug, Default)]
pub struct ResultPlane {
    state: Mutex<LeaseState>,
    landed: Mutex<Vec<ResultFill>>,
}

#[derive(Debug, Default)]
struct LeaseState {
    epochs: HashMap<u32, u64>,
    /// Bumped by a flush of everything.
    generation: u64,
    next: u64,
    outstanding: BTreeSet<u64>,
}

/// One outstanding lease; dropping it (landed, refused or abandoned) ends it.
#[derive(Debug)]
pub struct ResultLease {
    plane: Arc<ResultPlane>,
    pub id: u64,
    /// `(table, epoch)` when the lease was taken.
    pub epochs: Vec<(u32, u64)>,
    generation: u64,
}

impl Drop for ResultLease {
    fn drop(&mut self) {
        lock(&self.plane.state).outstanding.remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ResultPlane {
    /// Takes a lease on `tables` (before the statement is sent to the origin).
    pub fn lease(self: &Arc<Self>, tables: &[u32]) -> ResultLease {
        let mut st = lock(&self.state);
        let id = st.next;
        st.next += 1;
        st.outstanding.insert(id);
        let epochs = tables
            .iter()
            .map(|t| (*t, st.epochs.get(t).copied().unwrap_or(0)))
            .collect();
        ResultLease {
            plane: self.clone(),
            id,
            epochs,
            generation: st.generation,
        }
    }

    /// A WAL change of `table` was applied: leases taken before are void for it.
    pub fn bump(&self, table: u32) {
        *lock(&self.state).epochs.entry(table).or_insert(0) += 1;
    }

    /// Every table changed (a cache flush): every lease taken before is void.
    pub fn bump_all(&self) {
        lock(&self.state).generation += 1;
    }

    /// Whether no WAL change of the lease's tables was applied since it was taken.
    pub fn unchanged(&self, lease: &ResultLease) -> bool {
        let st = lock(&self.state);
        lease.generation == st.generation
            && lease
                .epochs
                .iter()
                .all(|(t, e)| st.epochs.get(t).copied().unwrap_or(0) == *e)
    }

    /// The oldest outstanding lease id, or the next id when none is outstanding.
    pub fn oldest_outstanding(&self) -> u64 {
        let st = lock(&self.state);
        st.outstanding.iter().next().copied().unwrap_or(st.next)
    }

    /// The id the next lease will get.
    pub fn next_id(&self) -> u64 {
        lock(&self.state).next
    }

    /// Hands a landed answer to the writer.
    pub fn push(&self, fill: ResultFill) {
        lock(&self.landed).push(fill);
    }

    /// The landed answers, oldest first.
    pub fn drain(&self) -> Vec<ResultFill> {
        std::mem::take(&mut *lock(&self.landed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let h = LatencyHistogram::default();
        h.record(0, 1);
        h.record(1_000, 2); // on the bound: that bucket
        h.record(1_001, 1);
        h.record(100_000_001, 3); // past the last bound
        let (b, sum) = h.snapshot();
        assert_eq!(b[0], 3);
        assert_eq!(b[1], 1);
        assert_eq!(b[LATENCY_BOUNDS_NS.len()], 3);
        assert_eq!(b.iter().sum::<u64>(), 7);
        assert_eq!(sum, 2_000 + 1_001 + 300_000_003);
    }
}
