//! Decoder for the `pgoutput` logical decoding output plugin, protocol versions 1 to 4.
//!
//! Purpose: turn the payload of one `XLogData` message into a typed [`Message`]. This is the
//! only place that knows pgoutput's byte layout (PostgreSQL docs, "Logical Replication Message
//! Formats").
//!
//! Streamed transactions (protocol 2+, `streaming 'on'`): Stream Start/Stop/Commit/Abort are
//! decoded by [`parse_message_in`] wherever they appear. Between a Stream Start and its Stream
//! Stop, the Relation, Type, Insert, Update, Delete, Truncate and Message messages carry the
//! (sub)transaction's xid right after the type byte; the caller says whether it is inside such
//! a block (`in_stream`), and gets that xid back. Protocols 3 and 4 change nothing else that
//! pgline asks for (two-phase and parallel streaming are never requested).
//!
//! Invariants:
//! - Input is untrusted: every length and count is checked against the bytes that remain;
//!   malformed input yields a [`DecodeError`], never a panic or an over-allocation (vector
//!   capacities are bounded by the bytes left, not by a declared count).
//! - Column values are zero-copy: [`TupleValue::Text`] is a `Bytes` slice of the input.
//! - A message must consume its whole input; trailing bytes are `Invalid(TrailingBytes)`.
//!
//! Timestamps are passed through as PostgreSQL sends them: microseconds since 2000-01-01 UTC
//! (the PostgreSQL epoch); callers convert.
//!
//! Thread model: pure functions, no state.
//!
//! Limitations: no two-phase messages and no binary columns (a `'b'` column is rejected as
//! `UnknownColumnKind`). Names are decoded as UTF-8
//! (the replication connection asks for `client_encoding=UTF8`).

use bytes::Bytes;

/// Why a pgoutput message could not be decoded. Small and `Copy` (codec style).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ended before a field it declares.
    Truncated,
    /// The first byte is not a known message type (or a stream control message inside a
    /// stream block).
    UnknownMessage(u8),
    /// A tuple column kind other than `n`, `u`, `t`.
    UnknownColumnKind(u8),
    /// An `Update`/`Delete` tuple marker other than the expected `K`/`O`/`N`.
    UnexpectedTupleMarker(u8),
    /// A negative length or count.
    NegativeLength,
    /// A string that is not UTF-8.
    InvalidUtf8,
    /// Bytes left over after the message.
    TrailingBytes,
    /// The input was empty.
    Empty,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for DecodeError {}

/// One column of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    Null,
    /// A TOASTed value that did not change; its value is not in the WAL.
    UnchangedToast,
    /// The value in PostgreSQL's text output format.
    Text(Bytes),
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelColumn {
    /// Part of the replica identity (usually the primary key).
    pub is_key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// Schema of a table as pgoutput describes it, sent before its first change in a session and
/// again after any schema change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    /// Empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    /// `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<RelColumn>,
}

/// The old row of an `Update` or `Delete`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `'K'`: only the replica identity columns are set (others are `Null`).
    Key(Vec<TupleValue>),
    /// `'O'`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(Vec<TupleValue>),
}

impl OldTuple {
    pub fn into_values(self) -> Vec<TupleValue> {
        match self {
            OldTuple::Key(v) | OldTuple::Full(v) => v,
        }
    }
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        final_lsn: u64,
        /// Microseconds since 2000-01-01 UTC.
        commit_ts: i64,
        xid: u32,
    },
    Commit {
        flags: u8,
        commit_lsn: u64,
        end_lsn: u64,
        /// Microseconds since 2000-01-01 UTC.
        commit_ts: i64,
    },
    Origin {
        commit_lsn: u64,
        name: String,
    },
    Relation(Relation),
    Type {
        id: u32,
        namespace: String,
        name: String,
    },
    Insert {
        rel: u32,
        new: Vec<TupleValue>,
    },
    Update {
        rel: u32,
        old: Option<OldTuple>,
        new: Vec<TupleValue>,
    },
    Delete {
        rel: u32,
        old: OldTuple,
    },
    Truncate {
        /// Bit 1: CASCADE, bit 2: RESTART IDENTITY.
        options: u8,
        rels: Vec<u32>,
    },
    /// A `pg_logical_emit_message` message.
    Message {
        transactional: bool,
        lsn: u64,
        prefix: String,
        content: Bytes,
    },
    /// Start of a block of changes of the in-progress transaction `xid`.
    StreamStart {
        xid: u32,
        /// The first block of this transaction (in this session).
        first_segment: bool,
    },
    /// End of the current stream block.
    StreamStop,
    /// The streamed transaction `xid` committed.
    StreamCommit {
        xid: u32,
        flags: u8,
        commit_lsn: u64,
        end_lsn: u64,
        /// Microseconds since 2000-01-01 UTC.
        commit_ts: i64,
    },
    /// The streamed transaction `xid` (when `subxid == xid`) or its subtransaction `subxid`
    /// aborted.
    StreamAbort {
        xid: u32,
        subxid: u32,
        /// Abort LSN and time: only sent with `streaming 'parallel'` (protocol 4), which pgline
        /// never asks for; decoded when present.
        lsn_ts: Option<(u64, i64)>,
    },
}

/// Decodes one pgoutput message outside a stream block (what protocol 1 sends).
pub fn parse_message(data: &Bytes) -> Result<Message, DecodeError> {
    parse_message_in(data, false).map(|(_, msg)| msg)
}

/// Decodes one pgoutput message. With `in_stream` (between Stream Start and Stream Stop), the
/// data messages carry a transaction id, returned as `Some(xid)`; otherwise the id is `None`.
/// Stream Start, Commit and Abort are rejected inside a block, as PostgreSQL never sends them
/// there.
pub fn parse_message_in(
    data: &Bytes,
    in_stream: bool,
) -> Result<(Option<u32>, Message), DecodeError> {
    let mut r = Reader { buf: data, pos: 0 };
    let tag = r.u8().map_err(|_| DecodeError::Empty)?;
    let carries_xid = in_stream && matches!(tag, b'R' | b'Y' | b'I' | b'U' | b'D' | b'T' | b'M');
    let xid = if carries_xid { Some(r.u32()?) } else { None };
    let msg = match tag {
        b'S' | b'c' | b'A' if in_stream => return Err(DecodeError::UnknownMessage(tag)),
        b'S' => Message::StreamStart {
            xid: r.u32()?,
            first_segment: r.u8()? == 1,
        },
        b'E' => Message::StreamStop,
        b'c' => Message::StreamCommit {
            xid: r.u32()?,
            flags: r.u8()?,
            commit_lsn: r.u64()?,
            end_lsn: r.u64()?,
            commit_ts: r.i64()?,
        },
        b'A' => {
            let xid = r.u32()?;
            let subxid = r.u32()?;
            // The parallel-streaming tail is there or not: decide by what is left.
            let lsn_ts = if r.remaining() == 0 {
                None
            } else {
                Some((r.u64()?, r.i64()?))
            };
            Message::StreamAbort {
                xid,
                subxid,
                lsn_ts,
            }
        }
        b'B' => Message::Begin {
            final_lsn: r.u64()?,
            commit_ts: r.i64()?,
            xid: r.u32()?,
        },
        b'C' => Message::Commit {
            flags: r.u8()?,
            commit_lsn: r.u64()?,
            end_lsn: r.u64()?,
            commit_ts: r.i64()?,
        },
        b'O' => Message::Origin {
            commit_lsn: r.u64()?,
            name: r.cstr()?,
        },
        b'R' => Message::Relation(parse_relation(&mut r)?),
        b'Y' => Message::Type {
            id: r.u32()?,
            namespace: r.cstr()?,
            name: r.cstr()?,
        },
        b'I' => {
            let rel = r.u32()?;
            expect_marker(&mut r, b"N")?;
            Message::Insert {
                rel,
                new: parse_tuple(&mut r)?,
            }
        }
        b'U' => parse_update(&mut r)?,
        b'D' => {
            let rel = r.u32()?;
            let marker = expect_marker(&mut r, b"KO")?;
            let values = parse_tuple(&mut r)?;
            Message::Delete {
                rel,
                old: old_tuple(marker, values),
            }
        }
        b'T' => parse_truncate(&mut r)?,
        b'M' => {
            let flags = r.u8()?;
            let lsn = r.u64()?;
            let prefix = r.cstr()?;
            let len = r.len32()?;
            Message::Message {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content: r.take(len)?,
            }
        }
        other => return Err(DecodeError::UnknownMessage(other)),
    };
    if r.pos != data.len() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok((xid, msg))
}

fn parse_relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let id = r.u32()?;
    let namespace = r.cstr()?;
    let name = r.cstr()?;
    let replica_identity = r.u8()?;
    let ncols = r.count16()?;
    // Each column needs at least 1 + 1 + 4 + 4 bytes: bound the allocation by what is left.
    let mut columns = Vec::with_capacity(ncols.min(r.remaining() / 10));
    for _ in 0..ncols {
        let flags = r.u8()?;
        columns.push(RelColumn {
            is_key: flags & 1 == 1,
            name: r.cstr()?,
            type_oid: r.u32()?,
            type_modifier: r.i32()?,
        });
    }
    Ok(Relation {
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn parse_update(r: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let rel = r.u32()?;
    let marker = expect_marker(r, b"KON")?;
    let old = if marker == b'N' {
        None
    } else {
        let values = parse_tuple(r)?;
        expect_marker(r, b"N")?;
        Some(old_tuple(marker, values))
    };
    Ok(Message::Update {
        rel,
        old,
        new: parse_tuple(r)?,
    })
}

fn parse_truncate(r: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let n = r.len32()?;
    let options = r.u8()?;
    let mut rels = Vec::with_capacity(n.min(r.remaining() / 4));
    for _ in 0..n {
        rels.push(r.u32()?);
    }
    Ok(Message::Truncate { options, rels })
}

fn old_tuple(marker: u8, values: Vec<TupleValue>) -> OldTuple {
    if marker == b'K' {
        OldTuple::Key(values)
    } else {
        OldTuple::Full(values)
    }
}

fn expect_marker(r: &mut Reader<'_>, allowed: &[u8]) -> Result<u8, DecodeError> {
    let m = r.u8()?;
    if allowed.contains(&m) {
        Ok(m)
    } else {
        Err(DecodeError::UnexpectedTupleMarker(m))
    }
}

fn parse_tuple(r: &mut Reader<'_>) -> Result<Vec<TupleValue>, DecodeError> {
    let ncols = r.count16()?;
    // Every column takes at least one byte.
    let mut values = Vec::with_capacity(ncols.min(r.remaining()));
    for _ in 0..ncols {
        let value = match r.u8()? {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::UnchangedToast,
            b't' => {
                let len = r.len32()?;
                TupleValue::Text(r.take(len)?)
            }
            other => return Err(DecodeError::UnknownColumnKind(other)),
        };
        values.push(value);
    }
    Ok(values)
}

/// A bounds-checked cursor over the message bytes.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos.checked_add(N).ok_or(DecodeError::Truncated)?;
        let slice = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// An Int16 count, rejected when negative.
    fn count16(&mut self) -> Result<usize, DecodeError> {
        let n = i16::from_be_bytes(self.array()?);
        usize::try_from(n).map_err(|_| DecodeError::NegativeLength)
    }

    /// An Int32 length or count, rejected when negative.
    fn len32(&mut self) -> Result<usize, DecodeError> {
        usize::try_from(self.i32()?).map_err(|_| DecodeError::NegativeLength)
    }

    fn take(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        let end = self.pos.checked_add(len).ok_or(DecodeError::Truncated)?;
        if end > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        let out = self.buf.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }

    fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = self.buf.get(self.pos..).ok_or(DecodeError::Truncated)?;
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated)?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| DecodeError::InvalidUtf8)?;
        let s = s.to_owned();
        self.pos += nul + 1;
        Ok(s)
    }
}

#[cfg(test)]
#[path = "pgoutput_tests.rs"]
mod tests;
