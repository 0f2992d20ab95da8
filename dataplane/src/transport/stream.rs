//! What a core loop needs of a userspace TCP stack, as a trait: accept connections on a port,
//! report what happened to them, move bytes in and out, flush egress once per turn.
//!
//! The userspace core loop (`engine::userspace`) is written against [`StreamStack`], not against
//! a particular stack, so the same loop runs over `net::Stack` on a DPDK or in-memory port and,
//! in tests, over a plain in-process byte pipe. Like every transport it knows nothing of RESP.
//!
//! Semantics every implementation keeps (the loop relies on them):
//! - `poll` appends [`StreamEvent::Accepted`] once per new connection (it may already hold
//!   data), [`StreamEvent::Readable`] when bytes or the peer's FIN arrived, [`StreamEvent::Writable`]
//!   when send space freed after a `send` took less than it was given, [`StreamEvent::Closed`]
//!   when the connection is gone (reset, or fully closed) and its id is dead;
//! - `recv` appends at most `max` bytes and returns how many; `Ok(0)` means nothing now;
//!   `Err(StreamError::Closed)` means the peer finished sending and everything was read;
//! - `send` may take fewer bytes than given (`Ok(0)` when the buffer is full);
//! - `close` sends FIN after the queued data; `abort` resets and frees at once; after either the
//!   id is not used again by the caller.

use std::fmt::Debug;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::Instant;

/// Something that happened to a connection since the last `poll`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEvent<Id> {
    /// A new connection, accepted on the listening `port`.
    Accepted {
        id: Id,
        port: u16,
    },
    Readable(Id),
    Writable(Id),
    Closed(Id),
}

/// Why a `recv` or `send` did not move bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// The peer finished sending (recv) or the connection can no longer send.
    Closed,
    /// The connection is broken or unknown: abort it.
    Failed,
}

/// Counters a stack reports to its core (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamCounters {
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
    pub tcp_retransmits: u64,
    /// Times a connection waited for a pooled buffer (our own TCP).
    pub tcp_buffer_waits: u64,
    /// Connections reset because their peer took none of their data in time (our own TCP).
    pub tcp_send_stall_aborts: u64,
}

/// A TCP stack owned by one core.
pub trait StreamStack {
    type Id: Copy + Eq + Hash + Debug;

    /// Accepts any number of connections on `port` (called once per port the core serves).
    fn listen(&mut self, port: u16);
    /// Receive path and timers; appends events. True if anything was done.
    fn poll(&mut self, now: Instant, events: &mut Vec<StreamEvent<Self::Id>>) -> bool;
    /// Appends up to `max` received bytes to `out`.
    fn recv(&mut self, id: Self::Id, out: &mut Vec<u8>, max: usize) -> Result<usize, StreamError>;
    /// Queues bytes to send; may take fewer than given.
    fn send(&mut self, id: Self::Id, data: &[u8]) -> Result<usize, StreamError>;
    /// FIN after the queued data.
    fn close(&mut self, id: Self::Id);
    /// Reset; state freed at once.
    fn abort(&mut self, id: Self::Id);
    /// Egress: transmit what connections have queued, due timers.
    fn flush(&mut self, now: Instant);
    /// Cumulative counters, for the core to publish.
    fn counters(&self) -> StreamCounters {
        StreamCounters::default()
    }
    /// The peer's address of a live connection (for the per-source connection limit); `None`
    /// when the stack does not know it (a test pipe).
    fn peer(&self, _id: Self::Id) -> Option<IpAddr> {
        None
    }
}
