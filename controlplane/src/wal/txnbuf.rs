//! Open transactions of the WAL stream, buffered until they commit, under one memory bound.
//!
//! Purpose: hold the changes of the Begin…Commit transaction being received and of every
//! streamed (in-progress, pgoutput 2+) transaction until its commit, and turn each into a
//! [`WalTxn`] then. Pure state, no I/O: the consumer feeds it decoded messages.
//!
//! Invariants:
//! - Nothing of a transaction leaves before its Commit / Stream Commit; an aborted streamed
//!   transaction leaves nothing.
//! - A subtransaction's abort cuts its transaction's changes at that subtransaction's first
//!   change (and forgets the subtransactions that began after it), as PostgreSQL's own apply
//!   worker truncates its spool file: a subtransaction's changes all come after its first one
//!   until it ends, and those of subtransactions nested in it come later still.
//! - [`TxnBuffers::bytes`] (estimated) is the sum over every open transaction and stays at or
//!   under the limit once [`TxnBuffers::push`] returns (unless the Relation messages alone
//!   exceed it). Past the limit the largest transaction *overflows*: its row changes are
//!   dropped, only its Relation changes and the set of tables it touches are kept, and at
//!   commit it becomes those Relations plus one [`Change::Invalidate`] of the tables. An
//!   overflowed transaction never buffers row changes again.
//!
//! Thread model: owned by the consumer task.
//!
//! Limitations: sizes are estimates (wire bytes of the message plus the decoded vectors), not
//! the allocator's figure. A subtransaction abort in an overflowed transaction changes nothing
//! (its tables are flushed anyway: more than needed, never less).

use std::collections::{BTreeSet, HashMap};
use std::mem::size_of;

use super::pgoutput::{Relation, TupleValue};
use super::{Change, WalError, WalTxn};

/// A transaction that went past the memory bound (for the log and the counter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Overflowed {
    pub xid: u32,
    /// Estimated bytes it held when it overflowed.
    pub bytes: usize,
    /// Tables it had touched so far.
    pub rels: Vec<u32>,
}

/// One open transaction.
#[derive(Debug)]
struct OpenTxn {
    xid: u32,
    changes: Vec<Change>,
    /// Estimated bytes of `changes` and `subxacts`.
    bytes: usize,
    /// Subtransactions, in order of their first change: (xid, index of that change, `bytes`
    /// before it).
    subxacts: Vec<(u32, usize, usize)>,
    /// Position of each subtransaction in `subxacts`.
    subxact_pos: HashMap<u32, usize>,
    /// Set once the transaction overflowed: the tables it touches.
    overflow: Option<BTreeSet<u32>>,
}

/// Estimated cost of one `subxacts` entry and its index slot.
const SUBXACT_BYTES: usize = 48;

impl OpenTxn {
    fn new(xid: u32) -> OpenTxn {
        OpenTxn {
            xid,
            changes: Vec::new(),
            bytes: 0,
            subxacts: Vec::new(),
            subxact_pos: HashMap::new(),
            overflow: None,
        }
    }

    /// Adds a change of subtransaction `sub` (`None` or the top xid: the transaction itself).
    fn push(&mut self, sub: Option<u32>, change: Change, size: usize) {
        if let Some(rels) = &mut self.overflow {
            if matches!(change, Change::Relation(_)) {
                self.bytes += size;
                self.changes.push(change);
            } else {
                touched(&change, rels);
            }
            return;
        }
        if let Some(sub) = sub.filter(|&s| s != self.xid) {
            let last = self.subxacts.last().map(|s| s.0);
            if last != Some(sub) && !self.subxact_pos.contains_key(&sub) {
                self.subxact_pos.insert(sub, self.subxacts.len());
                self.subxacts.push((sub, self.changes.len(), self.bytes));
                self.bytes += SUBXACT_BYTES;
            }
        }
        self.bytes += size;
        self.changes.push(change);
    }

    /// Drops subtransaction `sub`'s changes and those after them; returns the bytes freed.
    fn abort_subxact(&mut self, sub: u32) -> usize {
        if self.overflow.is_some() {
            return 0;
        }
        let Some(&pos) = self.subxact_pos.get(&sub) else {
            return 0;
        };
        let (_, first, bytes_before) = self.subxacts[pos];
        for (gone, _, _) in self.subxacts.drain(pos..) {
            self.subxact_pos.remove(&gone);
        }
        self.changes.truncate(first);
        let freed = self.bytes - bytes_before;
        self.bytes = bytes_before;
        freed
    }

    /// Switches to overflow; returns the bytes freed.
    fn overflow(&mut self) -> usize {
        let mut rels = BTreeSet::new();
        let mut kept = Vec::new();
        let mut kept_bytes = 0;
        for change in self.changes.drain(..) {
            if let Change::Relation(r) = &change {
                kept_bytes += relation_bytes(r);
                kept.push(change);
            } else {
                touched(&change, &mut rels);
            }
        }
        self.changes = kept;
        self.subxacts = Vec::new();
        self.subxact_pos = HashMap::new();
        self.overflow = Some(rels);
        let freed = self.bytes.saturating_sub(kept_bytes);
        self.bytes = kept_bytes;
        freed
    }

    fn into_txn(mut self, commit_lsn: u64, end_lsn: u64, commit_ts_us: i64) -> WalTxn {
        if let Some(rels) = self.overflow.take() {
            if !rels.is_empty() {
                self.changes.push(Change::Invalidate {
                    rels: rels.into_iter().collect(),
                });
            }
        }
        WalTxn {
            xid: self.xid,
            commit_lsn,
            end_lsn,
            commit_ts_us,
            changes: self.changes,
        }
    }
}

/// Adds the tables `change` touches to `rels`.
fn touched(change: &Change, rels: &mut BTreeSet<u32>) {
    match change {
        Change::Relation(_) => {}
        Change::Insert { rel, .. } | Change::Update { rel, .. } | Change::Delete { rel, .. } => {
            rels.insert(*rel);
        }
        Change::Truncate { rels: r } | Change::Invalidate { rels: r } => rels.extend(r),
    }
}

/// Estimated memory of a buffered change that arrived as `wire` bytes: the frame it points
/// into (values are slices of it) plus the decoded vectors.
pub(super) fn change_bytes(change: &Change, wire: usize) -> usize {
    let values = match change {
        Change::Relation(r) => return relation_bytes(r).max(wire),
        Change::Insert { new, .. } => new.len(),
        Change::Update { old_key, new, .. } => new.len() + old_key.as_ref().map_or(0, Vec::len),
        Change::Delete { old_key, .. } => old_key.len(),
        Change::Truncate { rels } | Change::Invalidate { rels } => rels.len(),
    };
    wire + size_of::<Change>() + values * size_of::<TupleValue>()
}

fn relation_bytes(r: &Relation) -> usize {
    size_of::<Change>()
        + r.namespace.len()
        + r.name.len()
        + r.columns
            .iter()
            .map(|c| size_of::<super::RelColumn>() + c.name.len())
            .sum::<usize>()
}

/// The open transactions of one replication session.
#[derive(Debug)]
pub(super) struct TxnBuffers {
    limit: usize,
    /// The Begin…Commit transaction being received.
    current: Option<OpenTxn>,
    /// Streamed transactions by top-level xid.
    streams: HashMap<u32, OpenTxn>,
    /// Top-level xid of the stream block being received (between Stream Start and Stop).
    block: Option<u32>,
    /// Sum of the open transactions' `bytes`.
    bytes: usize,
}

fn protocol(msg: String) -> WalError {
    WalError::Protocol(msg)
}

impl TxnBuffers {
    pub fn new(limit: usize) -> TxnBuffers {
        TxnBuffers {
            limit,
            current: None,
            streams: HashMap::new(),
            block: None,
            bytes: 0,
        }
    }

    /// Estimated bytes buffered over all open transactions.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A Begin…Commit transaction is open.
    pub fn in_txn(&self) -> bool {
        self.current.is_some()
    }

    /// Inside a stream block (between Stream Start and Stream Stop).
    pub fn in_block(&self) -> bool {
        self.block.is_some()
    }

    /// Opens a Begin…Commit transaction; returns the xid of one left open (dropped).
    pub fn begin(&mut self, xid: u32) -> Result<Option<u32>, WalError> {
        if self.block.is_some() {
            return Err(protocol(format!(
                "Begin of xid {xid} inside a stream block"
            )));
        }
        let dropped = self.current.take().map(|open| {
            self.bytes -= open.bytes;
            open.xid
        });
        self.current = Some(OpenTxn::new(xid));
        Ok(dropped)
    }

    /// Closes the Begin…Commit transaction.
    pub fn commit(
        &mut self,
        commit_lsn: u64,
        end_lsn: u64,
        commit_ts_us: i64,
    ) -> Result<WalTxn, WalError> {
        let open = self
            .current
            .take()
            .ok_or_else(|| protocol("Commit without Begin".into()))?;
        self.bytes -= open.bytes;
        Ok(open.into_txn(commit_lsn, end_lsn, commit_ts_us))
    }

    /// Stream Start: `first` opens the transaction (again, after a reconnect the server starts
    /// over); a later block of an unknown transaction is a protocol error.
    pub fn stream_start(&mut self, xid: u32, first: bool) -> Result<(), WalError> {
        if let Some(open) = self.block {
            return Err(protocol(format!(
                "Stream Start of xid {xid} inside the block of xid {open}"
            )));
        }
        if self.current.is_some() {
            return Err(protocol(format!(
                "Stream Start of xid {xid} inside a Begin…Commit transaction"
            )));
        }
        if first {
            if let Some(old) = self.streams.insert(xid, OpenTxn::new(xid)) {
                tracing::warn!(
                    xid,
                    "first stream segment of an open streamed transaction; restarted it"
                );
                self.bytes -= old.bytes;
            }
        } else if !self.streams.contains_key(&xid) {
            return Err(protocol(format!(
                "Stream Start continues xid {xid}, which was never started"
            )));
        }
        self.block = Some(xid);
        Ok(())
    }

    /// Stream Stop.
    pub fn stream_stop(&mut self) -> Result<(), WalError> {
        self.block
            .take()
            .map(|_| ())
            .ok_or_else(|| protocol("Stream Stop outside a stream block".into()))
    }

    /// Stream Commit of `xid`.
    pub fn stream_commit(
        &mut self,
        xid: u32,
        commit_lsn: u64,
        end_lsn: u64,
        commit_ts_us: i64,
    ) -> Result<WalTxn, WalError> {
        let open = self.streams.remove(&xid).ok_or_else(|| {
            protocol(format!(
                "Stream Commit of xid {xid}, which was never streamed"
            ))
        })?;
        self.bytes -= open.bytes;
        Ok(open.into_txn(commit_lsn, end_lsn, commit_ts_us))
    }

    /// Stream Abort: the whole transaction (`subxid == xid`) or one subtransaction. An unknown
    /// xid is ignored (nothing of it is buffered).
    pub fn stream_abort(&mut self, xid: u32, subxid: u32) {
        if subxid == xid {
            if let Some(open) = self.streams.remove(&xid) {
                self.bytes -= open.bytes;
            }
        } else if let Some(open) = self.streams.get_mut(&xid) {
            self.bytes -= open.abort_subxact(subxid);
        }
    }

    /// Buffers a change: into the stream block's transaction (`sub` is the xid the message
    /// carried), else into the Begin…Commit one. Returns the transactions that overflowed to
    /// keep the bound.
    pub fn push(
        &mut self,
        sub: Option<u32>,
        change: Change,
        wire: usize,
    ) -> Result<Vec<Overflowed>, WalError> {
        let size = change_bytes(&change, wire);
        let open = match self.block {
            Some(top) => self.streams.get_mut(&top),
            None => self.current.as_mut(),
        }
        .ok_or_else(|| protocol("row change outside a transaction".into()))?;
        let before = open.bytes;
        open.push(sub, change, size);
        self.bytes = self.bytes - before + open.bytes;
        Ok(self.enforce_limit())
    }

    /// Overflows the largest transactions until the total is under the limit.
    fn enforce_limit(&mut self) -> Vec<Overflowed> {
        let mut out = Vec::new();
        while self.bytes > self.limit {
            let largest = self
                .current
                .iter_mut()
                .chain(self.streams.values_mut())
                .filter(|t| t.overflow.is_none())
                .max_by_key(|t| t.bytes);
            let Some(open) = largest else { break };
            let bytes = open.bytes;
            let freed = open.overflow();
            self.bytes -= freed;
            out.push(Overflowed {
                xid: open.xid,
                bytes,
                rels: open
                    .overflow
                    .as_ref()
                    .map(|r| r.iter().copied().collect())
                    .unwrap_or_default(),
            });
        }
        out
    }
}

#[cfg(test)]
#[path = "txnbuf_tests.rs"]
mod tests;
