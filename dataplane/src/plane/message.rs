//! The messages between a core and the control plane: misses and their fills (RESP and
//! PostgreSQL point lookups), PostgreSQL requests and their relayed replies, and what a core
//! knows of a cacheable query result.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Names a connection outside its core: its slot and the slot's generation, so a reply for a
/// connection that closed while its request was in flight is recognised and dropped even after
/// the slot is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnToken(u64);

impl ConnToken {
    #[inline]
    pub fn new(slot: usize, generation: u32) -> ConnToken {
        ConnToken((slot as u64) << 32 | u64::from(generation))
    }

    #[inline]
    pub fn slot(self) -> usize {
        (self.0 >> 32) as usize
    }

    #[inline]
    pub fn generation(self) -> u32 {
        self.0 as u32
    }
}

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
    /// Identifies the connection on its core.
    pub conn: ConnToken,
    /// Identifies the pending reply on that connection.
    pub seq: u64,
    pub keys: Vec<MissKey>,
    /// Read the origin but install nothing: hits are currently not allowed (lag, lost stream).
    pub bypass: bool,
    /// Answer each key only with what the store holds or with an origin read known to be
    /// current (its lease still held and its snapshot seeing every change applied to the key,
    /// see `docs/consistency.md`); anything else (an error, a voided lease, a key the origin
    /// would reject) comes back as [`FillResult::Error`]. The PostgreSQL front asks this for a
    /// point lookup's miss: it answers the client from the reply, or forwards the statement.
    pub current_only: bool,
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
    pub conn: ConnToken,
    pub seq: u64,
    pub results: Vec<FillResult>,
    /// The origin's WAL position (`pg_current_wal_lsn()`) read in the same statement, after
    /// the snapshot, as the rows of these results; the highest over the request's keys, 0 when
    /// every key was answered without an origin read (from the store). A PostgreSQL session
    /// answered from the reply raises its fence to it, as it does after a forwarded read.
    pub lsn: u64,
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
    /// Identifies the connection on its core.
    pub conn: ConnToken,
    /// Identifies the reply on that connection; replies to one request share its `seq`.
    pub seq: u64,
    /// The session: the connection's client id (unique for the process lifetime).
    pub session: u64,
    pub kind: PgRequestKind,
    /// Raw frontend messages, see [`PgRequestKind`].
    pub messages: Vec<u8>,
    /// With a `Batch`: the Parse messages of statements the core answered from cache (so the
    /// relay never saw them) that the batch names, the unnamed one included, after a
    /// `Close S ""` when a simple Query the core answered destroyed the unnamed statement.
    /// The relay only books them for the session; a backend gets each one, hidden, when a
    /// Bind or Describe first needs it there. (Sent in front of the batch, their
    /// ParseComplete would reach the client.)
    pub statements: Vec<u8>,
    /// A `Batch` the query-result cache may keep: its one statement's answer is cacheable under
    /// this key when the batch runs with the session idle (the control plane's result cache).
    pub cache: Option<Box<ResultKey>>,
    /// A `Batch` whose reply should carry the fence and the origin-state verdict: it holds a
    /// statement the core could have answered from cache (a point lookup or a cacheable
    /// statement of a session that may read the cache). Without it the relay asks the origin
    /// nothing after the batch, and the reply's `fence_lsn` is 0 and `serve_cached` false: the
    /// core answers nothing from cache for the session until a reply with a fence reopens it.
    pub fence: bool,
    /// A `Batch` that cannot change the session state of the backend it runs on, with the
    /// session idle: it runs nothing (Parse, Describe, Close only) or one statement of
    /// constants such as `SELECT 1`. A backend that was in the pool's login state before it
    /// still is after it, and goes back to the pool without a state read.
    pub state_free: bool,
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
    /// The request is complete and the session is ready: `bytes` holds its ReadyForQuery,
    /// carrying this transaction status (`b'I'`, `b'T'` or `b'E'`), followed only by
    /// NotificationResponses that arrived after it (as PostgreSQL sends them while idle).
    Ready(u8),
    /// Fatal: write `bytes` (an ErrorResponse) and close the connection.
    Close,
}

/// The control plane's answer (or one chunk of it) to a [`PgRequest`].
#[derive(Debug)]
pub struct PgReply {
    pub conn: ConnToken,
    pub seq: u64,
    /// Backend messages to write to the client as they are.
    pub bytes: Vec<u8>,
    pub end: PgReplyEnd,
    /// Session consistency fence: when non-zero, the origin's WAL position after this request
    /// (taken after a write committed, or after a read the origin served). The session may be
    /// served from cache again only once the applied LSN has reached it.
    pub fence_lsn: u64,
    /// On a reply that ends [`PgReplyEnd::Ready`]: the origin session state this session now
    /// has was read from the origin after the request (only when it asked, see
    /// [`PgRequest::fence`], and at login) (identity: session user and current
    /// role; name resolution: the resolved search path and temporary objects; unreported
    /// output settings) and is the one cached answers were made under. False whenever that is
    /// not known, so the session is not served from cache until a later reply says so.
    pub serve_cached: bool,
    /// On a reply that ends [`PgReplyEnd::Ready`]: the new statement names the request's
    /// Parse messages gave that the origin did not take (the Parse failed, was skipped after
    /// an earlier error, or the batch never ran; the unnamed statement as an empty name). The
    /// core forgets them: PostgreSQL holds no such statement.
    pub unparsed: Vec<Box<[u8]>>,
    /// On a reply that ends [`PgReplyEnd::Ready`]: which of the request's `Close S` messages
    /// of named statements did not take effect (skipped after an earlier error) and took a
    /// statement that stands, by their place among those messages (0 for the first). The
    /// core forgot what each took when it forwarded the request and holds it again:
    /// PostgreSQL keeps it. (A skipped Close of a statement whose own Parse in the batch
    /// failed or was skipped is not listed: PostgreSQL holds nothing under that name.)
    pub unclosed: Vec<u32>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_token_round_trips_slot_and_generation() {
        for (slot, generation) in [(0, 0), (1, 7), (65_535, u32::MAX), (u32::MAX as usize, 1)] {
            let t = ConnToken::new(slot, generation);
            assert_eq!((t.slot(), t.generation()), (slot, generation));
        }
        assert_ne!(ConnToken::new(3, 1), ConnToken::new(3, 2));
    }
}
