//! A point lookup's store miss: one origin read answers the client and fills the store.
//!
//! ```text
//!  batch ── try_serve: may serve, key absent ──▶ Served::Miss
//!        └▶ request(): MissRequest { current_only } ──▶ writer (lease, batched fill read)
//!                      session waits (`waiting`), the batch stays unread in the input
//!  MissReply ──▶ apply_reply(): Landed { key, result, lsn }, session runnable again
//!  batch (same bytes) ── try_serve with the landed result:
//!        Row / Absent    ──▶ composed exactly as a hit (DataRow or none, `SELECT 1|0`),
//!                             fence raised to the read's WAL position
//!        Error, or not servable now ──▶ forwarded to the origin, no second fill
//! ```
//!
//! Purpose: before this, a miss was forwarded to the origin *and* a fill was queued whose
//! answer was thrown away: two origin statements (plus the relay's fence query) per miss. Now
//! the writer's fill read is the only origin statement: the client's answer is composed from it,
//! the store keeps it, and concurrent misses of all sessions share the writer's batched reads
//! (`origin.fill_batch` keys per statement).
//!
//! Invariants:
//! - A miss issues a fill or a forwarded statement, never both: if the miss queue is full, the
//!   batch is forwarded and no fill is asked.
//! - The answer is composed from the fill only when the writer says the read is current
//!   (`MissRequest::current_only`: its lease held and its snapshot sees every change the
//!   writer applied to the key, `docs/consistency.md`), or from what the store held when the
//!   writer took the miss. Anything else (an origin error, a voided lease, a timeout at
//!   `origin.query_timeout_ms`, a key text the origin's type would reject) forwards the batch,
//!   so correctness never rests on the fill.
//! - The whole batch is re-checked when the answer lands (`Serve::may_serve`, the statement's
//!   class, the key, the result formats): what would not be served from the store is not served
//!   from the fill either.
//! - The session's fence is raised to the WAL position the fill statement read after its
//!   snapshot (`MissReply::lsn`), so a later cached answer is never older than this one, exactly
//!   as after a forwarded read.
//!
//! Bounds: one fill per session at a time (the session waits, as for a forwarded batch), the
//! core's miss queue bounds a core's fills in flight; the batch waits in the input buffer it
//! already occupies (charged to the core's reply memory like any unread input), and the
//! writer answers every fill within `origin.query_timeout_ms`.
//!
//! Thread model: the owning core.

use std::sync::Arc;

use crate::engine::conn::Conn;
use crate::plane::{ConnToken, CorePort, CoreStats, FillResult, MissKey, MissReply, MissRequest};

/// A fill this session waits for.
#[derive(Debug)]
pub(crate) struct FillWait {
    seq: u64,
    table: u32,
    key: Box<[u8]>,
}

/// A fill's answer for the batch at the head of the session's input.
#[derive(Debug)]
pub(crate) struct Landed {
    pub table: u32,
    pub key: Box<[u8]>,
    /// The row, "no such row", or why the batch must go to the origin.
    pub result: FillResult,
    /// The origin's WAL position read with the row (0: answered from the store).
    pub lsn: u64,
}

impl Landed {
    /// Whether this answers the lookup of `key` in `table`.
    pub fn answers(&self, table: u32, key: &[u8]) -> bool {
        self.table == table && *self.key == *key
    }
}

/// Asks the writer for the fill of the key in the session's key buffer, in `table`; the session
/// then waits for it with the batch left unread. False (nothing changed) when the core's miss
/// queue is full: the caller forwards the batch instead.
pub(super) fn request(port: &CorePort, conn: &mut Conn, token: ConnToken, table: u32) -> bool {
    let seq = conn.next_seq;
    let Some(pg) = conn.pg.as_deref_mut() else {
        return false;
    };
    let key: Box<[u8]> = pg.key_buf.as_slice().into();
    let request = MissRequest {
        core: port.id(),
        conn: token,
        seq,
        keys: vec![MissKey {
            table,
            pk: key.clone(),
        }],
        bypass: false,
        current_only: true,
    };
    CoreStats::add(&port.stats().keys_miss, 1);
    if port.send_pg_miss(request).is_err() {
        CoreStats::add(&port.stats().pg_queue_full, 1);
        return false;
    }
    conn.next_seq += 1;
    pg.waiting = Some(seq);
    pg.fill = Some(FillWait { seq, table, key });
    true
}

/// The writer's answer to a fill: kept for the batch, and the session runs again. A reply to
/// anything else (an older request of a connection whose slot was reused is dropped before
/// this by the generation check) is ignored.
pub(crate) fn apply_reply(conn: &mut Conn, reply: &MissReply) {
    let Some(pg) = conn.pg.as_deref_mut() else {
        return;
    };
    if pg.waiting != Some(reply.seq) || pg.fill.as_ref().is_none_or(|w| w.seq != reply.seq) {
        return;
    }
    let Some(wait) = pg.fill.take() else { return };
    pg.waiting = None;
    let result = reply
        .results
        .first()
        .cloned()
        .unwrap_or_else(|| FillResult::Error(Arc::from("the fill reply has no result")));
    pg.landed = Some(Landed {
        table: wait.table,
        key: wait.key,
        result,
        lsn: reply.lsn,
    });
}
